"""The Triton kernels behind bertperf.kernels and their launchers. Imported only when a kernel
runs on CUDA (or under TRITON_INTERPRET=1 in the tests): importing bertperf.kernels never loads
Triton. Kernels read any activation dtype, compute in float32 and store in the dtype the caller
asks for. Nothing here imports the rest of bertperf.kernels: bertperf.kernels.aot imports these
modules to compile them ahead of time."""
