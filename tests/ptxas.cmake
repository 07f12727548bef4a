# ---- ptxas (label gpu): every CUDA kernel assembles with ptxas for sm_80 and sm_90 with
# no spills; tools/ptxas_check.py also reports registers, shared memory, threads per
# block and theoretical occupancy (docs/gpu.md, "ptxas: registers, spills, occupancy").
# Skipped (exit 77) where no ptxas is installed. Included at the end of CMakeLists.txt:
# uses cuda_kernel_files and HALFORMER_PYTHON from there. Halide's PTX carries no
# .maxntid / .reqntid and gives kernels dynamic shared memory sized by the host code, so
# ptxas_check reads block size and shared memory from each pipeline's lowered statement
# (test_kernel() writes it next to the library).
set(ptxas_check "${PROJECT_SOURCE_DIR}/tools/ptxas_check.py")
set(ptxas_dir "${CMAKE_CURRENT_BINARY_DIR}/ptxas")

# (a) every layer test kernel (all layer kinds and variants), for sm_80 and sm_90; the
# dynamic extents (rows, sequence, keys) at 512, a common max_len.
add_test(NAME gpu_ptxas_layers
         COMMAND "${HALFORMER_PYTHON}" "${ptxas_check}" --strict --sm 80,90 --extent 512
                 --work "${ptxas_dir}/layers" --json "${ptxas_dir}/layers.json" ${cuda_kernel_files})
set_tests_properties(gpu_ptxas_layers PROPERTIES LABELS gpu SKIP_RETURN_CODE 77)

# (b) every kernel of the gpu-small model (`halformer build` also checks it, for the
# spec's cuda_capability only; this adds sm_90). Extents: the spec's max_len.
set(ptxas_model "${CMAKE_BINARY_DIR}/models/gpu-small")
add_test(NAME gpu_ptxas_model_gpu-small
         COMMAND "${HALFORMER_PYTHON}" "${ptxas_check}" --strict --model "${ptxas_model}" --sm 80,90
                 --work "${ptxas_dir}/gpu-small" --json "${ptxas_dir}/gpu-small.json")
set_tests_properties(gpu_ptxas_model_gpu-small PROPERTIES
  FIXTURES_REQUIRED model_gpu-small LABELS gpu SKIP_RETURN_CODE 77)

# (c) the check can fail: a hand-written PTX that spills and one that does not assemble
# must be reported as failures; launch evaluation and occupancy against known values.
add_test(NAME gpu_ptxas_selftest COMMAND "${HALFORMER_PYTHON}" "${CMAKE_CURRENT_LIST_DIR}/ptxas_check_test.py")
set_tests_properties(gpu_ptxas_selftest PROPERTIES LABELS gpu)
# The scripts that run the CUDA tests and benchmark on a GPU machine (tools/gpu, docs/gpu.md)
# run only there: here they must at least parse.
add_test(NAME gpu_device_scripts_parse
         COMMAND sh -c "bash -n tools/gpu/bundle.sh && bash -n tools/gpu/run.sh && \"${HALFORMER_PYTHON}\" -m py_compile bench/halbench/gpu.py"
         WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}")
set_tests_properties(gpu_device_scripts_parse PROPERTIES LABELS gpu)
