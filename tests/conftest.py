import matplotlib

# Figures drawn by the library in this process stay off screen. (Not MPLBACKEND:
# the kernels papermill starts inherit the environment, and would lose inline figures.)
matplotlib.use("agg")
