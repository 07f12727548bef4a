"""The pieces of tools/ptxas_check.py (the entry point, with the command line and the
report): occupancy (CUDA's occupancy rules per SM), ptx (PTX found in Halide's objects,
ptxas run on it and its -v output read) and launch (the kernels' launch configuration
evaluated from a pipeline's lowered statement). Python 3 standard library only."""
