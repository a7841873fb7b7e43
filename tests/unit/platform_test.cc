// Proves where the tests run: an aarch64 build must be an aarch64 program executed by
// qemu-aarch64 (ctest's cross-compiling emulator), a host build a native program.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "transport/coap_dtls.h"

namespace {

// The kernel's name for this process. qemu-user fakes /proc/self/{exe,maps,cmdline}
// for the guest but not the status file, which names the emulator itself.
std::string process_name() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Name:", 0) == 0) {
      auto start = line.find_first_not_of(" \t", 5);
      return start == std::string::npos ? "" : line.substr(start);
    }
  }
  return "";
}

TEST(Platform, CompiledForTheConfiguredTarget) {
#if defined(EDGETRAIN_EXPECT_AARCH64)
#if !defined(__aarch64__)
  FAIL() << "an aarch64 build produced a non-aarch64 binary";
#endif
#else
#if defined(__aarch64__)
  FAIL() << "a host build produced an aarch64 binary";
#endif
#endif
  SUCCEED();
}

TEST(Platform, RunsUnderQemuExactlyWhenCrossCompiled) {
  const std::string name = process_name();
  ASSERT_FALSE(name.empty());
  std::cout << "process name: " << name << "\n";
#if defined(EDGETRAIN_EXPECT_QEMU)
  EXPECT_EQ(name, "qemu-aarch64") << "cross-compiled tests must run through the emulator";
#else
  EXPECT_EQ(name.find("qemu"), std::string::npos) << "host tests must run natively";
#endif
}

TEST(Platform, LibcoapUsesMbedTls) {
  EXPECT_TRUE(edgetrain::transport::tls_library_is_mbedtls())
      << edgetrain::transport::tls_library_description();
  EXPECT_EQ(edgetrain::transport::tls_library_description().rfind("Mbed TLS 2.28", 0), 0u)
      << edgetrain::transport::tls_library_description();
}

}  // namespace
