"""Kiln's TVM kernels: a TE compute plus an ``s_tir`` schedule rule each, picked by target features."""
