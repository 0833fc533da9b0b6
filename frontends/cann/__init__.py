"""The CANN frontend: read Ascend ``.om`` files (ge.proto or domi MODEL_DEF) into a Kiln Graph."""
