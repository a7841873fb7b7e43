# Cross-compiles for 64-bit Arm Linux (Raspberry Pi 3/4/5/Zero 2 W on 64-bit Raspberry Pi OS,
# which is Debian bookworm arm64) with Debian's g++-aarch64-linux-gnu against the sysroot
# that toolchains/setup-deps.sh unpacks from Debian arm64 packages.
#
# Tests run under qemu-aarch64 through CMAKE_CROSSCOMPILING_EMULATOR, so `ctest` works
# unchanged in a cross build tree.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

if(NOT EDGETRAIN_DEPS)
  if(DEFINED ENV{EDGETRAIN_DEPS})
    set(EDGETRAIN_DEPS "$ENV{EDGETRAIN_DEPS}")
  else()
    set(EDGETRAIN_DEPS "/var/cache/edgetrain")
  endif()
endif()
# try_compile projects re-read this file without the cache: pass the location on.
set(EDGETRAIN_DEPS "${EDGETRAIN_DEPS}" CACHE PATH "where toolchains/setup-deps.sh put its output")
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES EDGETRAIN_DEPS)

set(EDGETRAIN_SYSROOT "${EDGETRAIN_DEPS}/sysroot-aarch64")
if(NOT EXISTS "${EDGETRAIN_SYSROOT}/lib/ld-linux-aarch64.so.1")
  message(FATAL_ERROR "No aarch64 sysroot at ${EDGETRAIN_SYSROOT}: run toolchains/setup-deps.sh first")
endif()

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_SYSROOT "${EDGETRAIN_SYSROOT}")
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

# Generic ARMv8-A: runs on every supported board. boards/ refine -mcpu per board.
set(EDGETRAIN_AARCH64_CPU_FLAGS "-march=armv8-a" CACHE STRING "CPU flags for the aarch64 target")
set(CMAKE_C_FLAGS_INIT "${EDGETRAIN_AARCH64_CPU_FLAGS}")
set(CMAKE_CXX_FLAGS_INIT "${EDGETRAIN_AARCH64_CPU_FLAGS}")

# Programs (compilers, code generators) come from the host; libraries, headers and CMake
# packages only from the sysroot.
set(CMAKE_FIND_ROOT_PATH "${EDGETRAIN_SYSROOT}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

find_program(EDGETRAIN_QEMU_AARCH64 qemu-aarch64)
if(EDGETRAIN_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR "${EDGETRAIN_QEMU_AARCH64};-L;${EDGETRAIN_SYSROOT}")
endif()
