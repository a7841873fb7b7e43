// edgetrain-smoke: proves the stack works on this target before any training code runs.
//   check    XNNPACK computes a fully connected layer right, libcoap uses Mbed TLS, and a
//            CoAP request/response crosses DTLS-PSK on loopback (block-wise both ways)
//   serve    a DTLS-PSK echo server, for a client on another target (e.g. under QEMU)
//   request  a client for `serve`

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/atomic_file.h"
#include "common/settings.h"
#include "kernels/fully_connected.h"
#include "transport/coap_dtls.h"

namespace {

using edgetrain::settings::Table;
using edgetrain::transport::CoapCode;
using edgetrain::transport::CoapDtlsClient;
using edgetrain::transport::CoapDtlsServer;
using edgetrain::transport::CoapRequest;
using edgetrain::transport::CoapResponse;
using edgetrain::transport::Method;

#if defined(__aarch64__)
constexpr const char* kArch = "aarch64";
#elif defined(__x86_64__)
constexpr const char* kArch = "x86_64";
#else
constexpr const char* kArch = "unknown";
#endif

std::vector<std::uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

std::vector<std::uint8_t> pattern(std::size_t size) {
  std::vector<std::uint8_t> data(size);
  for (std::size_t i = 0; i < size; i++) data[i] = static_cast<std::uint8_t>((i * 131 + 7) & 0xff);
  return data;
}

// /echo answers with the body reversed (so a client can tell an answer from its own
// request); /hello names the identity the DTLS handshake proved.
void add_echo_resources(CoapDtlsServer& server, std::atomic<int>& handled) {
  server.add_resource("echo", Method::kPost, [&handled](const CoapRequest& request) {
    handled++;
    CoapResponse response{CoapCode::kChanged, {request.payload.rbegin(), request.payload.rend()}};
    return response;
  });
  server.add_resource("hello", Method::kGet, [&handled](const CoapRequest& request) {
    handled++;
    return CoapResponse{CoapCode::kContent,
                        bytes_of(std::string("hello ") + request.identity + " from " + kArch)};
  });
}

bool check_xnnpack() {
  const std::size_t B = 3, C = 37, OC = 11;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> inp(B * C), weight(OC * C), bias(OC), fast(B * OC), ref(B * OC);
  for (auto* v : {&inp, &weight, &bias})
    std::generate(v->begin(), v->end(), [&] { return dist(rng); });
  edgetrain::kernels::FullyConnectedXnn fc(C, OC, weight.data(), bias.data(), nullptr);
  fc.forward(fast.data(), inp.data(), B);
  edgetrain::kernels::fully_connected_forward_reference(ref.data(), inp.data(), weight.data(),
                                                        bias.data(), B, C, OC);
  float max_error = 0;
  for (std::size_t i = 0; i < fast.size(); i++)
    max_error = std::max(max_error, std::fabs(fast[i] - ref[i]));
  const bool ok = max_error < 1e-4f;
  std::printf("%s xnnpack: fully connected %zux%zu -> %zu, max |xnnpack - reference| = %.2e\n",
              ok ? "PASS" : "FAIL", B, C, OC, max_error);
  return ok;
}

bool check_tls_library() {
  const bool ok = edgetrain::transport::tls_library_is_mbedtls();
  std::printf("%s libcoap (D)TLS library: %s\n", ok ? "PASS" : "FAIL",
              edgetrain::transport::tls_library_description().c_str());
  return ok;
}

bool check_dtls_roundtrip() {
  const std::string identity = "smoke-device";
  const std::vector<std::uint8_t> key = bytes_of("smoke-test-psk-0123456789");
  CoapDtlsServer::Options server_options;
  server_options.psk_lookup = [&](std::string_view id) -> std::optional<std::vector<std::uint8_t>> {
    if (id == identity) return key;
    return std::nullopt;
  };
  CoapDtlsServer server(server_options);
  std::atomic<int> handled = 0;
  add_echo_resources(server, handled);
  std::atomic<bool> stop = false;
  std::thread server_thread([&] {
    while (!stop) server.run_once(20);
  });
  bool ok = false;
  std::string detail;
  try {
    CoapDtlsClient client({"127.0.0.1", server.port(), {identity, key}, 10000});
    const auto start = std::chrono::steady_clock::now();
    CoapResponse hello = client.request(Method::kGet, "hello");
    const auto body = pattern(5000);  // five 1024-byte blocks each way
    CoapResponse echo = client.request(Method::kPost, "echo", body);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    const bool reversed =
        std::equal(body.rbegin(), body.rend(), echo.payload.begin(), echo.payload.end());
    ok = hello.code == CoapCode::kContent && echo.code == CoapCode::kChanged && reversed;
    detail = "GET /hello " + edgetrain::transport::coap_code_string(hello.code) + " \"" +
             std::string(hello.payload.begin(), hello.payload.end()) + "\", POST /echo 5000 B " +
             edgetrain::transport::coap_code_string(echo.code) +
             (reversed ? " (echo correct)" : " (echo WRONG)") + ", " +
             std::to_string(static_cast<int>(ms)) + " ms with handshake";
  } catch (const std::exception& e) {
    detail = e.what();
  }
  stop = true;
  server_thread.join();
  std::printf("%s DTLS-PSK CoAP round trip on 127.0.0.1:%u: %s\n", ok ? "PASS" : "FAIL",
              server.port(), detail.c_str());
  return ok;
}

// The command line: no subcommand runs every check; `serve` and `request` are the two halves
// of the cross test (an aarch64 client under QEMU against a host server).
struct SmokeSettings {
  std::string identity = "smoke-device";
  std::string key = "smoke-test-psk-0123456789";
  std::string bind = "127.0.0.1";
  std::string host = "127.0.0.1";
  std::string port_file;
  int port = 0, max_requests = 0;
  double timeout_s = 60;
  std::size_t size = 5000;
};

int serve_echo(const SmokeSettings& s) {
  CoapDtlsServer::Options options;
  options.bind_address = s.bind;
  options.port = static_cast<std::uint16_t>(s.port);
  options.psk_lookup = [&](std::string_view id) -> std::optional<std::vector<std::uint8_t>> {
    if (id == s.identity) return bytes_of(s.key);
    return std::nullopt;
  };
  CoapDtlsServer server(options);
  std::atomic<int> handled = 0;
  add_echo_resources(server, handled);
  std::printf("edgetrain-smoke (%s): serving DTLS-PSK on %s:%u\n", kArch, s.bind.c_str(),
              server.port());
  std::fflush(stdout);
  if (!s.port_file.empty())
    edgetrain::common::write_file_atomically(s.port_file, std::to_string(server.port()) + "\n");
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(s.timeout_s);
  while (std::chrono::steady_clock::now() < deadline &&
         (s.max_requests == 0 || handled < s.max_requests)) {
    server.run_once(50);
  }
  // Let the last response's blocks and ACKs go out before exiting.
  for (int i = 0; i < 10; i++) server.run_once(20);
  std::printf("edgetrain-smoke: served %d requests\n", handled.load());
  return s.max_requests == 0 || handled >= s.max_requests ? 0 : 1;
}

int request_echo(const SmokeSettings& s) {
  CoapDtlsClient client(
      {s.host, static_cast<std::uint16_t>(s.port), {s.identity, bytes_of(s.key)}, 30000});
  CoapResponse hello = client.request(Method::kGet, "hello");
  std::printf("client (%s): GET /hello -> %s \"%s\"\n", kArch,
              edgetrain::transport::coap_code_string(hello.code).c_str(),
              std::string(hello.payload.begin(), hello.payload.end()).c_str());
  const auto body = pattern(s.size);
  CoapResponse echo = client.request(Method::kPost, "echo", body);
  const bool reversed =
      std::equal(body.rbegin(), body.rend(), echo.payload.begin(), echo.payload.end());
  std::printf("client (%s): POST /echo %zu B -> %s, %s\n", kArch, s.size,
              edgetrain::transport::coap_code_string(echo.code).c_str(),
              reversed ? "echo correct" : "echo WRONG");
  return hello.code == CoapCode::kContent && echo.code == CoapCode::kChanged && reversed ? 0 : 1;
}

void declare_options(Table& serve, Table& request, SmokeSettings& s) {
  serve.add("bind", s.bind, "address to listen on");
  serve.add("port", s.port, "UDP port; 0 picks a free one").range(0, 65535);
  serve.add("port-file", s.port_file, "write the bound port to this file once listening");
  serve.add("requests", s.max_requests, "exit after this many requests (0: only on timeout)")
      .range(0, 1000000);
  serve.add("timeout", s.timeout_s, "exit after this many seconds")
      .range(0, 1000000)
      .unit("seconds");
  request.add("host", s.host, "server address");
  request.add("port", s.port, "server UDP port").range(1, 65535).required();
  request.add("size", s.size, "bytes to echo").range(0, 1000000);
  for (auto* sub : {&serve, &request}) {
    sub->add("identity", s.identity, "PSK identity");
    sub->add("key", s.key, "PSK key");
  }
}

}  // namespace

int main(int argc, char** argv) {
  Table app("edgetrain-smoke", "checks that XNNPACK, libcoap and Mbed TLS work on this target");
  Table& serve = app.subcommand("serve", "run a DTLS-PSK echo server (POST /echo, GET /hello)");
  Table& request =
      app.subcommand("request", "call a `serve` instance: GET /hello, then POST /echo");
  SmokeSettings settings;
  declare_options(serve, request, settings);
  if (const auto status = app.parse(argc, argv)) return *status;
  try {
    if (serve.parsed()) return serve_echo(settings);
    if (request.parsed()) return request_echo(settings);
    std::printf("edgetrain-smoke on %s\n", kArch);
    const bool ok = check_xnnpack() & check_tls_library() & check_dtls_roundtrip();
    std::printf("%s\n", ok ? "smoke: all checks passed" : "smoke: SOME CHECKS FAILED");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "edgetrain-smoke: %s\n", e.what());
    return 1;
  }
}
