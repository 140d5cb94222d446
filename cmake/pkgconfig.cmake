# Generates libmoe.pc (template cmake/libmoe.pc.in) from the dependencies the
# configure step found, and installs it into P/lib/pkgconfig.
#
# The dependencies are written as the paths CMake resolved (OpenBLAS, cJSON,
# zfp, oneDNN and OpenMP, MPI), turned into -L/-l flags. The static library needs them all at link
# time, so they go into Libs (a plain `pkg-config --libs libmoe` links); with
# MOE_SHARED they go into Libs.private except MPI, which a program using the
# MPI headers calls directly. The prefix is the one given at install time
# (`cmake --install build --prefix P`), not the configure-time one.

# moe_pc_lib_flags(OUT lib...): " -L<dir> -l<name> ..." for library paths and names.
function(moe_pc_lib_flags out)
  set(flags "")
  foreach(lib IN LISTS ARGN)
    if(lib STREQUAL "")
      continue()
    elseif(lib MATCHES "^-")
      list(APPEND flags "${lib}")
    elseif(lib MATCHES "^(.*)/lib([^/]+)\\.(so|a|dylib)(\\.[0-9.]+)?$")
      set(dir "${CMAKE_MATCH_1}")
      set(name "${CMAKE_MATCH_2}")
      if(NOT dir IN_LIST CMAKE_C_IMPLICIT_LINK_DIRECTORIES)
        list(APPEND flags "-L${dir}")
      endif()
      list(APPEND flags "-l${name}")
    elseif(IS_ABSOLUTE "${lib}")
      list(APPEND flags "${lib}")
    else()
      list(APPEND flags "-l${lib}")
    endif()
  endforeach()
  set(text "")
  foreach(f IN LISTS flags)
    string(APPEND text " ${f}")
  endforeach()
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

# Dependencies, in static link order (users of a library before the library).
set(moe_pc_deps "")
set(moe_pc_mpi_libs "")
set(MOE_PC_CFLAGS "")
if(MOE_HAVE_ZFP)
  get_target_property(moe_zfp_lib zfp::zfp LOCATION)
  list(APPEND moe_pc_deps "${moe_zfp_lib}")
endif()
if(MOE_HAVE_MPI)
  # moe/comm.h includes <mpi.h>: its include directories go into Cflags.
  foreach(dir IN LISTS MPI_C_INCLUDE_DIRS)
    string(APPEND MOE_PC_CFLAGS " -I${dir}")
  endforeach()
  foreach(opt IN LISTS MPI_C_COMPILE_OPTIONS)
    string(APPEND MOE_PC_CFLAGS " ${opt}")
  endforeach()
  foreach(def IN LISTS MPI_C_COMPILE_DEFINITIONS)
    string(APPEND MOE_PC_CFLAGS " -D${def}")
  endforeach()
  set(moe_pc_mpi_libs ${MPI_C_LINK_FLAGS} ${MPI_C_LIBRARIES})
endif()
if(MOE_HAVE_DNNL)
  # the onednn backend: libdnnl and the OpenMP runtime it runs on (libmoe sets
  # its thread count through omp_set_num_threads)
  get_target_property(moe_dnnl_lib DNNL::dnnl LOCATION)
  if(NOT moe_dnnl_lib)
    find_library(moe_dnnl_lib NAMES dnnl)
  endif()
  list(APPEND moe_pc_deps "${moe_dnnl_lib}" "${MOE_GOMP_LIB}")
endif()
if(MOE_HAVE_MHD)
  list(APPEND moe_pc_deps "${MOE_MHD_LIB}")
endif()
if(MOE_HAVE_CURL)
  list(APPEND moe_pc_deps ${CURL_LIBRARIES})
endif()
list(APPEND moe_pc_deps ${OPENBLAS_LIB} ${CJSON_LIB})
if(CMAKE_THREAD_LIBS_INIT)
  list(APPEND moe_pc_deps ${CMAKE_THREAD_LIBS_INIT})
else()
  list(APPEND moe_pc_deps -lpthread)  # glibc >= 2.34: pthreads in libc, -lpthread is an empty stub
endif()
list(APPEND moe_pc_deps -lm)

if(MOE_SHARED)
  set(MOE_PC_SHARED 1)
  moe_pc_lib_flags(MOE_PC_LIBS ${moe_pc_mpi_libs})
  moe_pc_lib_flags(MOE_PC_LIBS_PRIVATE ${moe_pc_deps})
else()
  set(MOE_PC_SHARED 0)
  moe_pc_lib_flags(MOE_PC_LIBS ${moe_pc_mpi_libs} ${moe_pc_deps})
  set(MOE_PC_LIBS_PRIVATE "")
endif()

# prefix, libdir and includedir stay @-placeholders here and are filled in at
# install time, when the --prefix given to `cmake --install` is known.
set(MOE_PC_PREFIX "@CMAKE_INSTALL_PREFIX@")
foreach(kind LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${kind}}")
    set(MOE_PC_${kind} "${CMAKE_INSTALL_${kind}}")
  else()
    set(MOE_PC_${kind} "\${prefix}/${CMAKE_INSTALL_${kind}}")
  endif()
endforeach()
configure_file(${PROJECT_SOURCE_DIR}/cmake/libmoe.pc.in ${CMAKE_BINARY_DIR}/generated/libmoe.pc.in @ONLY)
install(CODE "configure_file(\"${CMAKE_BINARY_DIR}/generated/libmoe.pc.in\"
                             \"${CMAKE_BINARY_DIR}/libmoe.pc\" @ONLY)")
install(FILES ${CMAKE_BINARY_DIR}/libmoe.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
