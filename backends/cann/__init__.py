"""The CANN backend: Ascend offline-model (``.om``) files with a ge.proto or domi MODEL_DEF."""
