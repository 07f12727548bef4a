# ---- ptxas (label gpu): every CUDA kernel assembles with ptxas for sm_80 and sm_90 with
# no spills; tools/ptxas_check.py also reports registers, shared memory, threads per
# block and theoretical occupancy (docs/gpu.md, "ptxas: registers, spills, occupancy").
# Skipped (exit 77) where no ptxas is installed. Included at the end of CMakeLists.txt:
# uses test_kernels_cuda, cuda_kernel_files and HALFORMER_PYTHON from there.
set(ptxas_check "${PROJECT_SOURCE_DIR}/tools/ptxas_check.py")
set(ptxas_dir "${CMAKE_CURRENT_BINARY_DIR}/ptxas")

# Launch configuration of the layer test kernels. Halide's PTX carries no .maxntid /
# .reqntid and gives kernels dynamic shared memory sized by the host code, so
# ptxas_check reads the block size and the shared memory from each pipeline's lowered
# statement (its halide_cuda_run call). test_kernel() keeps no record of its generator
# parameters: its calls are read back from CMakeLists.txt and the statement is made by
# the same generator with the same target (ptxas_check refuses a statement whose PTX
# differs from the library's, so a mismatch cannot go unnoticed).
file(STRINGS "${CMAKE_CURRENT_LIST_DIR}/CMakeLists.txt" ptxas_kernel_calls REGEX "^test_kernel\\(")
set(ptxas_stmts "")
set(ptxas_stmt_kernels "")
foreach (call IN LISTS ptxas_kernel_calls)
  if (NOT call MATCHES "^test_kernel\\(([A-Za-z0-9_]+) ([A-Za-z0-9_]+)(.*)\\)[ \t]*$")
    message(WARNING "tests/ptxas.cmake: cannot read '${call}' (one test_kernel() call per line)")
    continue ()
  endif ()
  set(k "${CMAKE_MATCH_1}_cuda")
  set(gen "${CMAKE_MATCH_2}")
  separate_arguments(params UNIX_COMMAND "${CMAKE_MATCH_3}")
  add_custom_command(OUTPUT "${ptxas_dir}/${k}.stmt"
                     COMMAND ${CMAKE_COMMAND} -E make_directory "${ptxas_dir}"
                     COMMAND halformer::halformer_generators -g ${gen} -n ${k} -f ${k} -e stmt -o "${ptxas_dir}"
                             target=host-cuda-cuda_capability_80-no_runtime ${params}
                     DEPENDS halformer::halformer_generators
                     COMMENT "Lowered statement of ${k} (launch configuration for ptxas_check)" VERBATIM)
  list(APPEND ptxas_stmts "${ptxas_dir}/${k}.stmt")
  list(APPEND ptxas_stmt_kernels ${k})
endforeach ()
foreach (k IN LISTS test_kernels_cuda)
  if (NOT k IN_LIST ptxas_stmt_kernels)
    message(WARNING "tests/ptxas.cmake: no test_kernel() line for ${k}; gpu_ptxas_layers will fail on it")
  endif ()
endforeach ()
add_custom_target(test_kernels_cuda_stmt ALL DEPENDS ${ptxas_stmts})

# (a) every layer test kernel (all layer kinds and variants), for sm_80 and sm_90; the
# dynamic extents (rows, sequence, keys) at 512, a common max_len.
add_test(NAME gpu_ptxas_layers
         COMMAND "${HALFORMER_PYTHON}" "${ptxas_check}" --strict --sm 80,90 --extent 512 --stmt-dir "${ptxas_dir}"
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
