# halformer_add_model(NAME SPEC <spec.yaml> [OUTPUT_DIR <dir>])
#
# Lowers a model spec to a build: runs the spec compiler at configure time (re-run
# whenever the spec changes), adds one Halide AOT library per planned pipeline, and
# links the runtime into <NAME> (inference executable) and lib<NAME>.a (static library
# carrying the runtime and every kernel). Works inside the halformer build tree or,
# with HALFORMER_BUILD_DIR pointing at one, from any other CMake project.
include_guard(GLOBAL)

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
  foreach (device IN LISTS HALFORMER_PLAN_VARIANTS)
    foreach (k IN LISTS HALFORMER_PLAN_KERNELS)
      set(lib ${k})
      if (NOT device STREQUAL "cpu")
        set(lib ${k}_${device})
      endif ()
      add_halide_library(${lib} FROM halformer::halformer_generators
                         GENERATOR ${HALFORMER_PLAN_${k}_GENERATOR}
                         PARAMS ${HALFORMER_PLAN_${k}_PARAMS}
                         TARGETS ${HALFORMER_PLAN_TARGET_${device}}
                         USE_RUNTIME ${NAME}_halide_runtime)
      list(APPEND kernels ${lib})
    endforeach ()
  endforeach ()

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
  add_executable(${NAME}_bin $<TARGET_OBJECTS:${cli_main}>)
  target_link_libraries(${NAME}_bin PRIVATE ${NAME}_model ${cli_main})
  set_target_properties(${NAME}_bin PROPERTIES OUTPUT_NAME ${NAME})
  # Linked in the build tree, then installed by copy + rename: an interrupted build
  # leaves the previous binary in OUTPUT_DIR whole and usable.
  set(exe "${ARG_OUTPUT_DIR}/${NAME}")
  foreach (out IN ITEMS "${exe}" "${ARG_OUTPUT_DIR}/lib${NAME}.a")
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
  add_custom_target(${NAME}_install ALL DEPENDS "${exe}")

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
