# halformer_add_model(NAME SPEC <spec.yaml> [OUTPUT_DIR <dir>])
#
# Lowers a model spec to a build: runs the spec compiler at configure time (re-run
# whenever the spec changes), adds one Halide AOT library per planned pipeline, and
# links the runtime into <NAME> (inference executable) and lib<NAME>.a (static library
# carrying the runtime and every kernel). Works inside the halformer build tree or,
# with HALFORMER_BUILD_DIR pointing at one, from any other CMake project. CUDA kernels
# are checked with ptxas (no spills; <OUTPUT_DIR>/ptxas.json) where ptxas is found.
include_guard(GLOBAL)
# tools/ptxas_check.py, for the CUDA kernels' ptxas check (found from here at call time).
get_filename_component(HALFORMER_PTXAS_CHECK "${CMAKE_CURRENT_LIST_DIR}/../tools/ptxas_check.py" ABSOLUTE)
set(HALFORMER_PTXAS_CHECK "${HALFORMER_PTXAS_CHECK}" CACHE INTERNAL "")
# The check's modules (tools/ptxas/): a change to any of them re-runs it.
file(GLOB HALFORMER_PTXAS_MODULES "${CMAKE_CURRENT_LIST_DIR}/../tools/ptxas/*.py")
set(HALFORMER_PTXAS_MODULES "${HALFORMER_PTXAS_MODULES}" CACHE INTERNAL "")

if (NOT TARGET Halide::Generator)
  find_package(Halide 21 REQUIRED)
endif ()
if (NOT TARGET halformer_runtime AND NOT TARGET halformer::halformer_runtime)
  if (NOT HALFORMER_BUILD_DIR)
    message(FATAL_ERROR "halformer: set HALFORMER_BUILD_DIR to a built halformer tree")
  endif ()
  find_package(nlohmann_json 3 REQUIRED)
  find_package(CLI11 REQUIRED)
  include("${HALFORMER_BUILD_DIR}/cmake/halformer-runtime-targets.cmake")
  include("${HALFORMER_BUILD_DIR}/cmake/halformer-halide_generatorsConfig.cmake")
  set(HALFORMER_TOOL "${HALFORMER_BUILD_DIR}/bin/halformer")
endif ()

function(halformer_add_model NAME)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "" "SPEC;OUTPUT_DIR" "TARGETS")
  if (NOT ARG_SPEC)
    message(FATAL_ERROR "halformer_add_model(${NAME}): SPEC is required")
  endif ()
  get_filename_component(spec "${ARG_SPEC}" ABSOLUTE)
  if (NOT ARG_OUTPUT_DIR)
    set(ARG_OUTPUT_DIR "${CMAKE_CURRENT_BINARY_DIR}")
  endif ()
  set(plan_dir "${CMAKE_CURRENT_BINARY_DIR}/${NAME}.plan")

  # 1. Spec -> plan (configure time; the spec and the tool are configure dependencies).
  execute_process(COMMAND "${HALFORMER_TOOL}" plan "${spec}" --out "${plan_dir}"
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if (NOT rc EQUAL 0)
    message(FATAL_ERROR "halformer: ${spec} is not a valid spec:\n${err}")
  endif ()
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${spec}" "${HALFORMER_TOOL}")
  include("${plan_dir}/plan.cmake")
  # 2. One AOT library per pipeline and device variant (cpu: <k>, cuda: <k>_cuda, ...),
  #    all sharing one Halide runtime (one thread pool, every device API the variants use).
  if (ARG_TARGETS)
    message(FATAL_ERROR "halformer_add_model(${NAME}): targets come from the spec's `targets:` list")
  endif ()
  add_halide_runtime(${NAME}_halide_runtime TARGETS host)
  set(kernels "")
  set(cuda_kernels "")
  set(cuda_stmts "")
  foreach (device IN LISTS HALFORMER_PLAN_VARIANTS)
    foreach (k IN LISTS HALFORMER_PLAN_KERNELS)
      set(lib ${k})
      set(extra "")
      if (NOT device STREQUAL "cpu")
        set(lib ${k}_${device})
      endif ()
      if (device STREQUAL "cuda")
        # The lowered statement too (same generator run): the ptxas check below reads
        # each kernel's launch (threads per block, dynamic shared memory) from it.
        set(extra STMT stmt)
      endif ()
      add_halide_library(${lib} FROM halformer::halformer_generators
                         GENERATOR ${HALFORMER_PLAN_${k}_GENERATOR}
                         PARAMS ${HALFORMER_PLAN_${k}_PARAMS}
                         TARGETS ${HALFORMER_PLAN_TARGET_${device}}
                         USE_RUNTIME ${NAME}_halide_runtime ${extra})
      list(APPEND kernels ${lib})
      if (device STREQUAL "cuda")
        list(APPEND cuda_kernels ${lib})
        list(APPEND cuda_stmts ${stmt})
      endif ()
    endforeach ()
  endforeach ()

  # 2b. ptxas: every CUDA kernel must assemble for sm_<cuda_capability> without spills
  #     (tools/ptxas_check.py; registers, shared memory, occupancy in OUTPUT_DIR/ptxas.json).
  #     HALFORMER_PTXAS: set by `halformer build` (empty: not found, it said so), else
  #     searched here: PATH, $CUDA_HOME/bin, $CUDA_PATH/bin, /usr/local/cuda/bin.
  if (cuda_kernels)
    if (DEFINED HALFORMER_PTXAS)
      set(ptxas "${HALFORMER_PTXAS}")
    else ()
      find_program(HALFORMER_PTXAS_EXECUTABLE ptxas)
      find_program(HALFORMER_PTXAS_EXECUTABLE ptxas NO_DEFAULT_PATH
                   PATHS "$ENV{CUDA_HOME}/bin" "$ENV{CUDA_PATH}/bin" /usr/local/cuda/bin)
      set(ptxas "${HALFORMER_PTXAS_EXECUTABLE}")
      if (NOT ptxas)
        message(STATUS "halformer: ptxas not found (PATH, CUDA_HOME, CUDA_PATH, /usr/local/cuda/bin): "
                       "${NAME}'s CUDA kernels are not checked for spills")
      endif ()
    endif ()
    # Python 3 (standard library only): halformer's own venv (tools/bootstrap.sh), else any.
    get_filename_component(venv "${HALFORMER_PTXAS_CHECK}/../../.venv/bin" ABSOLUTE)
    find_program(HALFORMER_PYTHON3 NAMES python3 python PATHS "${venv}" NO_DEFAULT_PATH)
    if (NOT HALFORMER_PYTHON3)
      find_package(Python3 COMPONENTS Interpreter QUIET)
      set(HALFORMER_PYTHON3 "${Python3_EXECUTABLE}")
    endif ()
    if (ptxas AND NOT HALFORMER_PYTHON3)
      message(STATUS "halformer: no python3: ${NAME}'s CUDA kernels are not checked with ptxas")
    elseif (ptxas)
      # The dynamic extents (sequence, keys) at the model's max_len, for the launch.
      set(max_len ${HALFORMER_PLAN_MAX_LEN})
      if (NOT max_len GREATER 0)
        set(max_len 512)
      endif ()
      set(files "")
      foreach (k IN LISTS cuda_kernels)
        list(APPEND files $<TARGET_FILE:${k}>)
      endforeach ()
      set(ptxas_json "${ARG_OUTPUT_DIR}/ptxas.json")
      add_custom_command(OUTPUT "${ptxas_json}"
                         COMMAND "${HALFORMER_PYTHON3}" "${HALFORMER_PTXAS_CHECK}" --quiet --skip-ok
                                 --ptxas "${ptxas}" --sm ${HALFORMER_PLAN_CUDA_SM} --extent ${max_len}
                                 --stmt-dir "${CMAKE_CURRENT_BINARY_DIR}" --json "${ptxas_json}" ${files}
                         DEPENDS ${cuda_kernels} ${cuda_stmts} "${HALFORMER_PTXAS_CHECK}" ${HALFORMER_PTXAS_MODULES}
                         COMMENT "ptxas: ${NAME}'s CUDA kernels for sm_${HALFORMER_PLAN_CUDA_SM}" VERBATIM)
      add_custom_target(${NAME}_ptxas ALL DEPENDS "${ptxas_json}")
    endif ()
  endif ()

  # 3. Glue + runtime -> library and executable.
  if (TARGET halformer_runtime)
    set(runtime halformer_runtime)
    set(cli_main halformer_cli_main)
  else ()
    set(runtime halformer::halformer_runtime)
    set(cli_main halformer::halformer_cli_main)
  endif ()
  add_library(${NAME}_model STATIC "${plan_dir}/${HALFORMER_PLAN_NAME}_model.cpp")
  target_link_libraries(${NAME}_model PUBLIC ${runtime} ${kernels} ${NAME}_halide_runtime)
  target_include_directories(${NAME}_model PUBLIC "${plan_dir}")  # <name>.h: the descriptor
  add_executable(${NAME}_bin "${plan_dir}/${HALFORMER_PLAN_NAME}_main.cpp" $<TARGET_OBJECTS:${cli_main}>)
  target_link_libraries(${NAME}_bin PRIVATE ${NAME}_model ${cli_main})
  set_target_properties(${NAME}_bin PROPERTIES OUTPUT_NAME ${NAME})

  # lib<NAME>.so: the descriptor and the kernels only, for loading at run time (Python).
  # Its Halide runtime calls bind to the one in halformer's shared runtime (libhalformer_rt.so,
  # which the loading program already has), so every model opened in a process shares one
  # thread pool and error handler; the kernel archives are linked by file to leave out
  # the per-model Halide runtime they would otherwise bring.
  if (TARGET halformer_rt)
    set(rt_shared halformer_rt)
  else ()
    set(rt_shared halformer::halformer_rt)
  endif ()
  set(kernel_files "")
  foreach (k IN LISTS kernels)
    list(APPEND kernel_files $<TARGET_FILE:${k}>)
  endforeach ()
  add_library(${NAME}_shared MODULE "${plan_dir}/${HALFORMER_PLAN_NAME}_entry.cpp"
              "${plan_dir}/${HALFORMER_PLAN_NAME}_model.cpp")
  add_dependencies(${NAME}_shared ${kernels})
  target_link_libraries(${NAME}_shared PRIVATE ${kernel_files} ${rt_shared})
  target_include_directories(${NAME}_shared PRIVATE "${CMAKE_CURRENT_BINARY_DIR}"  # kernel headers
                             $<TARGET_PROPERTY:${rt_shared},INTERFACE_INCLUDE_DIRECTORIES>)
  set_target_properties(${NAME}_shared PROPERTIES OUTPUT_NAME ${NAME} PREFIX lib CXX_VISIBILITY_PRESET hidden)
  target_link_options(${NAME}_shared PRIVATE "LINKER:--no-undefined")
  # Linked in the build tree, then installed by copy + rename: an interrupted build
  # leaves the previous binary in OUTPUT_DIR whole and usable.
  set(exe "${ARG_OUTPUT_DIR}/${NAME}")
  foreach (out IN ITEMS "${exe}" "${ARG_OUTPUT_DIR}/lib${NAME}.a" "${ARG_OUTPUT_DIR}/lib${NAME}.so" "${ARG_OUTPUT_DIR}/${HALFORMER_PLAN_NAME}.h")
    get_filename_component(out_real "${out}" REALPATH)
    get_filename_component(spec_real "${spec}" REALPATH)
    if (out_real STREQUAL spec_real)
      message(FATAL_ERROR "halformer: output ${out} would overwrite the spec ${spec}; choose another -o directory")
    endif ()
  endforeach ()
  add_custom_command(OUTPUT "${exe}"
                     COMMAND ${CMAKE_COMMAND} -E copy $<TARGET_FILE:${NAME}_bin> "${exe}.tmp"
                     COMMAND ${CMAKE_COMMAND} -E rename "${exe}.tmp" "${exe}"
                     DEPENDS ${NAME}_bin COMMENT "Installing ${exe}" VERBATIM)
  set(so "${ARG_OUTPUT_DIR}/lib${NAME}.so")
  add_custom_command(OUTPUT "${so}"
                     COMMAND ${CMAKE_COMMAND} -E copy $<TARGET_FILE:${NAME}_shared> "${so}.tmp"
                     COMMAND ${CMAKE_COMMAND} -E rename "${so}.tmp" "${so}"
                     DEPENDS ${NAME}_shared COMMENT "Installing ${so}" VERBATIM)
  set(header "${ARG_OUTPUT_DIR}/${HALFORMER_PLAN_NAME}.h")
  add_custom_command(OUTPUT "${header}"
                     COMMAND ${CMAKE_COMMAND} -E copy_if_different "${plan_dir}/${HALFORMER_PLAN_NAME}.h" "${header}"
                     DEPENDS "${plan_dir}/${HALFORMER_PLAN_NAME}.h" VERBATIM)
  add_custom_target(${NAME}_install ALL DEPENDS "${exe}" "${so}" "${header}")

  # lib<NAME>.a: the runtime, the glue and every kernel in one archive (ar MRI script).
  set(archives $<TARGET_FILE:${NAME}_model> $<TARGET_FILE:${runtime}>)
  foreach (k IN LISTS kernels ITEMS ${NAME}_halide_runtime)
    list(APPEND archives $<TARGET_FILE:${k}>)
  endforeach ()
  set(mri "${CMAKE_CURRENT_BINARY_DIR}/${NAME}.mri")
  set(lib "${ARG_OUTPUT_DIR}/lib${NAME}.a")
  file(GENERATE OUTPUT "${mri}" CONTENT
       "create ${lib}.tmp\n$<JOIN:$<LIST:TRANSFORM,${archives},PREPEND,addlib >,\n>\nsave\nend\n")
  add_custom_command(OUTPUT "${lib}"
                     COMMAND sh -c "\"${CMAKE_AR}\" -M < \"${mri}\""
                     COMMAND ${CMAKE_COMMAND} -E rename "${lib}.tmp" "${lib}"
                     DEPENDS ${NAME}_model ${runtime} ${kernels} ${NAME}_halide_runtime "${mri}"
                     COMMENT "Bundling lib${NAME}.a" VERBATIM)
  add_custom_target(${NAME}_bundle ALL DEPENDS "${lib}")
endfunction()
