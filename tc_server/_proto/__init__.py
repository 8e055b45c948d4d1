"""Generated protobuf modules (see tools/gen_proto.py). Nothing here is written by hand."""
