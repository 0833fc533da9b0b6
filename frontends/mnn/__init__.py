"""The MNN frontend: read ``.mnn`` files (Kiln's and MNN's converter's) into a Kiln Graph."""
