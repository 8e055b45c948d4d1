# Fuzzing the running server over its sockets (tests/hostile/test_fuzz_server.py: the Pulsar port;
# tests/hostile/test_fuzz_admin.py: the admin port); included by the Makefile.
#   make fuzz        -- the bounded run the suite does (40 examples per target)
#   make fuzz-long   -- FUZZ_EXAMPLES examples per target, batches of FUZZ_MIN_BATCH..FUZZ_BATCH commands
#                       each sent FUZZ_REPEAT times (defaults: over a million frames), random seeds;
#                       prints the number of frames sent. Fails on any traceback in the server's log,
#                       any UnknownError for a well-formed request, any unanswered request.
#   make hostile     -- every hostile-input test (tests/hostile), the bounded fuzz included
#   make hostile-load -- the floods of issue 15 against a real tc-server process for HOSTILE_SECONDS while a
#                       well-behaved client runs, the server in a memory cgroup of HOSTILE_MEMORY_LIMIT_MIB
#                       (the deploy manifests' limit; 0: none); prints its RSS, OOM kills and the client's outcome
FUZZ_EXAMPLES ?= 480
FUZZ_BATCH ?= 300
FUZZ_MIN_BATCH ?= 150
FUZZ_REPEAT ?= 10

HOSTILE_SECONDS ?= 60
HOSTILE_MEMORY_LIMIT_MIB ?= 256

.PHONY: fuzz fuzz-long hostile hostile-load
fuzz: setup
	$(PY) -m pytest tests/hostile/test_fuzz_server.py tests/hostile/test_fuzz_admin.py -s $(PYTEST_ARGS)

fuzz-long: setup
	TC_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) TC_FUZZ_BATCH=$(FUZZ_BATCH) TC_FUZZ_MIN_BATCH=$(FUZZ_MIN_BATCH) \
	    TC_FUZZ_REPEAT=$(FUZZ_REPEAT) \
	    $(PY) -m pytest tests/hostile/test_fuzz_server.py tests/hostile/test_fuzz_admin.py -s -x \
	    -p no:cacheprovider -o timeout=0 $(PYTEST_ARGS)

hostile: setup
	$(PY) -m pytest tests/hostile $(PYTEST_ARGS)

hostile-load: setup
	$(PY) -m tests.hostile.load --seconds $(HOSTILE_SECONDS) --memory-limit-mib $(HOSTILE_MEMORY_LIMIT_MIB)
