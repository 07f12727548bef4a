# The model tests' helpers, shared by models/ and tools/tune/: each model is built with
# the CLI (as a user would), its PyTorch reference is made at test time by
# reference/torch_reference.py, and test_model (models/test_model.cpp) compares them.
# Included by tests/CMakeLists.txt; uses torch_reference and HALFORMER_PYTHON from there.

# model_vs_torch(NAME SPEC [WEIGHTS file] [reference script options...]): random weights
# made by the reference script unless WEIGHTS names a file to use.
function(model_vs_torch NAME SPEC)
  cmake_parse_arguments(PARSE_ARGV 2 ARG "" "WEIGHTS" "")
  set(out "${CMAKE_BINARY_DIR}/models/${NAME}")
  set(weights "${out}/reference/weights.safetensors")
  set(ref_args ${ARG_UNPARSED_ARGUMENTS})
  if (ARG_WEIGHTS)
    set(weights "${ARG_WEIGHTS}")
    list(APPEND ref_args --weights "${ARG_WEIGHTS}")
  endif ()
  add_test(NAME build_${NAME} COMMAND halformer build "${SPEC}" -o "${out}")
  set_tests_properties(build_${NAME} PROPERTIES FIXTURES_SETUP model_${NAME} LABELS golden)
  add_test(NAME torch_reference_${NAME}
           COMMAND "${HALFORMER_PYTHON}" "${torch_reference}"
                   "${SPEC}" "${out}/reference" ${ref_args})
  # HALFORMER_CLI: the oracle reads the spec's defaults from `halformer check --print-defaults`.
  set_tests_properties(torch_reference_${NAME} PROPERTIES FIXTURES_SETUP reference_${NAME} LABELS golden
                       ENVIRONMENT "HALFORMER_CLI=$<TARGET_FILE:halformer>")
  add_test(NAME model_vs_torch_${NAME} COMMAND test_model)
  set_tests_properties(model_vs_torch_${NAME} PROPERTIES
    FIXTURES_REQUIRED "model_${NAME};reference_${NAME}" LABELS golden
    ENVIRONMENT "HALFORMER_MODEL_BIN=${out}/${NAME};HALFORMER_REFERENCE_DIR=${out}/reference;HALFORMER_WEIGHTS=${weights}")
endfunction()

# model_vs_torch_precision(NAME SPEC PRECISION TOLERANCE): a reduced-precision build
# (`halformer build --precision int8|bf16`) of a model_vs_torch model against the same
# fp32 PyTorch reference, within TOLERANCE (relative; docs/precision.md).
# [VARIANT]: a spec variant of the same model (its own build and test names, suffix _VARIANT).
function(model_vs_torch_precision NAME SPEC PRECISION TOLERANCE)
  set(tag ${PRECISION})
  if (ARGC GREATER 4)
    set(tag ${PRECISION}_${ARGV4})
  endif ()
  set(ref "${CMAKE_BINARY_DIR}/models/${NAME}")
  set(out "${CMAKE_BINARY_DIR}/models/${NAME}-${tag}")
  add_test(NAME build_${NAME}_${tag} COMMAND halformer build "${SPEC}" --precision ${PRECISION} -o "${out}")
  set_tests_properties(build_${NAME}_${tag} PROPERTIES FIXTURES_SETUP model_${NAME}_${tag} LABELS golden)
  add_test(NAME model_vs_torch_${NAME}_${tag} COMMAND test_model)
  set_tests_properties(model_vs_torch_${NAME}_${tag} PROPERTIES
    FIXTURES_REQUIRED "model_${NAME}_${tag};reference_${NAME}" LABELS golden
    ENVIRONMENT "HALFORMER_MODEL_BIN=${out}/${NAME};HALFORMER_REFERENCE_DIR=${ref}/reference;HALFORMER_WEIGHTS=${ref}/reference/weights.safetensors;HALFORMER_RUN_TAG=${tag};HALFORMER_TOLERANCE=${TOLERANCE}")
endfunction()

# A model_vs_torch model's build for DEVICE (its spec lists it in targets): OpenCL runs
# on PoCL; CUDA is skipped, not failed, where no driver or GPU is present.
# With PRECISION P TOLERANCE T: its model_vs_torch_precision build instead.
function(model_vs_torch_device NAME DEVICE)
  cmake_parse_arguments(PARSE_ARGV 2 ARG "" "PRECISION;TOLERANCE" "")
  set(ref "${CMAKE_BINARY_DIR}/models/${NAME}")
  set(out "${ref}")
  set(build "${NAME}")
  set(env "")
  if (ARG_PRECISION)
    set(out "${ref}-${ARG_PRECISION}")
    set(build "${NAME}_${ARG_PRECISION}")
    set(env ";HALFORMER_RUN_TAG=${ARG_PRECISION}-${DEVICE};HALFORMER_TOLERANCE=${ARG_TOLERANCE}")
  endif ()
  set(test model_vs_torch_${build}_${DEVICE})
  add_test(NAME ${test} COMMAND test_model)
  set_tests_properties(${test} PROPERTIES
    FIXTURES_REQUIRED "model_${build};reference_${NAME}" LABELS gpu
    ENVIRONMENT "HALFORMER_MODEL_BIN=${out}/${NAME};HALFORMER_REFERENCE_DIR=${ref}/reference;HALFORMER_WEIGHTS=${ref}/reference/weights.safetensors;HALFORMER_DEVICE=${DEVICE};HL_OCL_DEVICE_TYPE=cpu${env}")
  if (DEVICE STREQUAL "cuda")
    set_tests_properties(${test} PROPERTIES LABELS "gpu;cuda" SKIP_REGULAR_EXPRESSION "is not usable here")
  endif ()
endfunction()
