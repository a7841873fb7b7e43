# Finds edgetrain's third-party libraries for the current target (host or the aarch64
# sysroot) and wraps them as imported targets. Everything here was installed or built
# by toolchains/setup-deps.sh; a missing piece stops configuration with a pointer to it.
#
# Targets: edgetrain_deps::xnnpack  edgetrain_deps::mbedtls  edgetrain_deps::mbedcrypto  edgetrain_deps::mbedx509  edgetrain_deps::coap
#          GTest::gtest(_main) GTest::gmock  CLI11::CLI11  tomlplusplus::tomlplusplus
#          nlohmann_json::nlohmann_json  ZLIB::ZLIB

if(NOT EDGETRAIN_DEPS)
  if(DEFINED ENV{EDGETRAIN_DEPS})
    set(EDGETRAIN_DEPS "$ENV{EDGETRAIN_DEPS}")
  else()
    set(EDGETRAIN_DEPS "/var/cache/edgetrain")
  endif()
endif()
set(EDGETRAIN_DEPS "${EDGETRAIN_DEPS}" CACHE PATH "where toolchains/setup-deps.sh put its output")

set(_edgetrain_hint "run toolchains/setup-deps.sh (as root) to install it")

function(edgetrain_require_library var name)
  find_library(${var} NAMES ${name})
  if(NOT ${var})
    message(FATAL_ERROR "library '${name}' not found for ${CMAKE_SYSTEM_PROCESSOR}: ${_edgetrain_hint}")
  endif()
endfunction()

# XNNPACK with its thread pool and CPU detection (Debian: libxnnpack-dev, 2022-02 API).
find_path(EDGETRAIN_XNNPACK_INCLUDE xnnpack.h)
if(NOT EDGETRAIN_XNNPACK_INCLUDE)
  message(FATAL_ERROR "xnnpack.h not found: ${_edgetrain_hint}")
endif()
edgetrain_require_library(EDGETRAIN_XNNPACK_LIB XNNPACK)
edgetrain_require_library(EDGETRAIN_PTHREADPOOL_LIB pthreadpool)
edgetrain_require_library(EDGETRAIN_CPUINFO_LIB cpuinfo)
find_package(Threads REQUIRED)
add_library(edgetrain_deps::xnnpack INTERFACE IMPORTED)
target_include_directories(edgetrain_deps::xnnpack SYSTEM INTERFACE "${EDGETRAIN_XNNPACK_INCLUDE}")
target_link_libraries(edgetrain_deps::xnnpack INTERFACE
  "${EDGETRAIN_XNNPACK_LIB}" "${EDGETRAIN_PTHREADPOOL_LIB}" "${EDGETRAIN_CPUINFO_LIB}" Threads::Threads)

# Mbed TLS 2.28 (Debian: libmbedtls-dev).
find_path(EDGETRAIN_MBEDTLS_INCLUDE mbedtls/ssl.h)
if(NOT EDGETRAIN_MBEDTLS_INCLUDE)
  message(FATAL_ERROR "mbedtls/ssl.h not found: ${_edgetrain_hint}")
endif()
edgetrain_require_library(EDGETRAIN_MBEDTLS_LIB mbedtls)
edgetrain_require_library(EDGETRAIN_MBEDX509_LIB mbedx509)
edgetrain_require_library(EDGETRAIN_MBEDCRYPTO_LIB mbedcrypto)
add_library(edgetrain_deps::mbedtls INTERFACE IMPORTED)
target_include_directories(edgetrain_deps::mbedtls SYSTEM INTERFACE "${EDGETRAIN_MBEDTLS_INCLUDE}")
target_link_libraries(edgetrain_deps::mbedtls INTERFACE
  "${EDGETRAIN_MBEDTLS_LIB}" "${EDGETRAIN_MBEDX509_LIB}" "${EDGETRAIN_MBEDCRYPTO_LIB}")
# Mbed TLS's cryptography alone (X25519, HKDF, ChaCha20, CTR_DRBG), without its TLS layer:
# what privacy/ (secure aggregation) links.
add_library(edgetrain_deps::mbedcrypto INTERFACE IMPORTED)
target_include_directories(edgetrain_deps::mbedcrypto SYSTEM INTERFACE "${EDGETRAIN_MBEDTLS_INCLUDE}")
target_link_libraries(edgetrain_deps::mbedcrypto INTERFACE "${EDGETRAIN_MBEDCRYPTO_LIB}")
# Mbed TLS's X.509 certificates (parse, verify against a CA) over its cryptography, without
# the TLS layer: what privacy/key_signing.cc links for keys signed by device certificates.
add_library(edgetrain_deps::mbedx509 INTERFACE IMPORTED)
target_include_directories(edgetrain_deps::mbedx509 SYSTEM INTERFACE "${EDGETRAIN_MBEDTLS_INCLUDE}")
target_link_libraries(edgetrain_deps::mbedx509 INTERFACE "${EDGETRAIN_MBEDX509_LIB}" "${EDGETRAIN_MBEDCRYPTO_LIB}")

# libcoap 4.3.1 built from Debian's source package against Mbed TLS, static, per target.
# It lives outside the sysroot, so it is addressed by path rather than found.
if(CMAKE_CROSSCOMPILING)
  set(EDGETRAIN_COAP_PREFIX "${EDGETRAIN_DEPS}/libcoap-${CMAKE_SYSTEM_PROCESSOR}")
else()
  set(EDGETRAIN_COAP_PREFIX "${EDGETRAIN_DEPS}/libcoap-host")
endif()
if(NOT EXISTS "${EDGETRAIN_COAP_PREFIX}/lib/libcoap-3.a")
  message(FATAL_ERROR "libcoap (Mbed TLS build) not found at ${EDGETRAIN_COAP_PREFIX}: ${_edgetrain_hint}")
endif()
add_library(edgetrain_deps::coap STATIC IMPORTED)
set_target_properties(edgetrain_deps::coap PROPERTIES
  IMPORTED_LOCATION "${EDGETRAIN_COAP_PREFIX}/lib/libcoap-3.a"
  INTERFACE_INCLUDE_DIRECTORIES "${EDGETRAIN_COAP_PREFIX}/include"
  INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${EDGETRAIN_COAP_PREFIX}/include"
  INTERFACE_LINK_LIBRARIES edgetrain_deps::mbedtls)
# libcoap's private headers and its build's coap_config.h (setup-deps.sh installs them), for
# the one source file that must read a session's private state (transport/libcoap_block_bodies.c).
set(EDGETRAIN_COAP_INTERNAL_INCLUDE "${EDGETRAIN_COAP_PREFIX}/internal")
if(NOT EXISTS "${EDGETRAIN_COAP_INTERNAL_INCLUDE}/coap_config.h")
  message(FATAL_ERROR "libcoap's internal headers not found at ${EDGETRAIN_COAP_INTERNAL_INCLUDE}: ${_edgetrain_hint}")
endif()

# Small well-kept helpers.
find_package(CLI11 CONFIG REQUIRED)
find_package(tomlplusplus CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
find_package(ZLIB REQUIRED)
if(EDGETRAIN_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)
endif()
