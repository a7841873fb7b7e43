// What the CoAP server and client of coap_dtls.h share (coap_internal.h): libcoap start-up
// and logging, CoAP timing, DTLS-PSK and X.509 set-up, addresses; and the small public
// functions of coap_dtls.h that belong to neither side. With coap_server.cc and
// coap_client.cc, the only files that include libcoap and Mbed TLS (with bench_load.cc).
#include "transport/coap_internal.h"
#include "transport/untrusted_text.h"

#include <mbedtls/ssl.h>

#include <netdb.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <mutex>

namespace edgetrain::transport {

static_assert(kMaxPskBytes == MBEDTLS_PSK_MAX_LEN,
              "kMaxPskBytes must be the PSK limit of the Mbed TLS we link");
namespace {

coap_fixed_point_t to_fixed_point(double value) {
  const long thousandths = std::lround(value * 1000);
  return {static_cast<uint16_t>(thousandths / 1000), static_cast<uint16_t>(thousandths % 1000)};
}

// libcoap's log lines carry what peers sent (a PSK identity at debug level, URIs and
// payloads in PDU dumps), so they are escaped like every other network text. Destination
// and prefix stay libcoap's own: stdout, or stderr from LOG_CRIT up; timestamp, level.
std::atomic<int> probe_reset_mid{-1};  // expect_probe_reset()

void log_escaped(coap_log_t level, const char* message) {
  static const char* const kLevelNames[] = {"EMRG", "ALRT", "CRIT", "ERR ",
                                            "WARN", "NOTE", "INFO", "DEBG"};
  std::string_view text(message);
  if (!text.empty() && text.back() == '\n')
    text.remove_suffix(1);  // libcoap ends each message with one
  constexpr std::string_view kResetLine = "got RST for mid=0x";
  if (level == LOG_ALERT && text.starts_with(kResetLine)) {
    const std::string digits(text.substr(kResetLine.size()));
    if (std::strtol(digits.c_str(), nullptr, 16) == probe_reset_mid.load()) return;
  }
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%b %d %H:%M:%S", &local);
  const int index = static_cast<int>(level);
  const char* name = index >= 0 && index < 8 ? kLevelNames[index] : "????";
  std::FILE* out = level <= LOG_CRIT ? stderr : stdout;
  std::fprintf(out, "%s %s %s\n", stamp, name, escape_untrusted(text, 4096).c_str());
  std::fflush(out);
}

}  // namespace

void expect_probe_reset(int mid) { probe_reset_mid.store(mid); }

void coap_library_startup() {
  static std::once_flag once;
  std::call_once(once, [] {
    coap_startup();
    // libcoap logs to stderr. Keep it to real problems unless EDGETRAIN_COAP_LOG asks
    // for more (syslog levels, 7 = debug). Mbed TLS's own debug output reports a peer's
    // ordinary close_notify as an error; handshake failures reach callers as exceptions
    // anyway. libcoap 4.3.1 switches Mbed TLS's debug output off only for levels
    // between LOG_WARNING and LOG_INFO (LOG_ERR and below map to Mbed TLS level 1).
    int level = LOG_ERR, dtls_level = LOG_WARNING;
    if (const char* env = std::getenv("EDGETRAIN_COAP_LOG")) level = dtls_level = std::atoi(env);
    coap_set_log_handler(&log_escaped);
    coap_set_show_pdu_output(0);  // PDU dumps through the handler too, not straight to stdout
    coap_set_log_level(level);
    coap_dtls_set_log_level(dtls_level);
  });
}

void release_payload(coap_session_t*, void* app_ptr) {
  delete static_cast<std::vector<std::uint8_t>*>(app_ptr);
}

void apply_timing(coap_session_t* session, const CoapTiming& timing) {
  coap_session_set_ack_timeout(session, to_fixed_point(timing.ack_timeout_seconds));
  coap_session_set_ack_random_factor(session, to_fixed_point(timing.ack_random_factor));
  coap_session_set_max_retransmit(session, static_cast<uint16_t>(timing.max_retransmit));
  coap_session_set_nstart(session, static_cast<uint16_t>(timing.nstart));
}

void check_certificate_files(const CertificateFiles& files) {
  const std::pair<const char*, const std::string*> named[] = {
      {"certificate", &files.certificate_file},
      {"private key", &files.private_key_file},
      {"CA", &files.ca_file}};
  for (const auto& [what, path] : named) {
    if (path->empty()) throw TransportError(std::string("X.509: no ") + what + " file given");
    std::ifstream in(*path);
    if (!in)
      throw TransportError(std::string("X.509: cannot read the ") + what + " file '" + *path + "'");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (text.find("-----BEGIN ") == std::string::npos)
      throw TransportError(std::string("X.509: the ") + what + " file '" + *path + "' is not PEM");
  }
}

coap_dtls_pki_t pki_setup(const CertificateFiles& files) {
  coap_dtls_pki_t pki{};
  pki.version = COAP_DTLS_PKI_SETUP_VERSION;
  pki.verify_peer_cert = 1;
  pki.check_common_ca = 1;
  pki.allow_self_signed = 0;
  pki.allow_expired_certs = 0;
  pki.cert_chain_validation = 1;
  pki.cert_chain_verify_depth = 2;
  pki.check_cert_revocation = 0;
  pki.pki_key.key_type = COAP_PKI_KEY_PEM;
  pki.pki_key.key.pem.public_cert = files.certificate_file.c_str();
  pki.pki_key.key.pem.private_key = files.private_key_file.c_str();
  pki.pki_key.key.pem.ca_file = files.ca_file.c_str();
  return pki;
}

const char* peer_authentication_name(PeerAuthentication authentication) {
  switch (authentication) {
    case PeerAuthentication::kNone:
      return "none";
    case PeerAuthentication::kPsk:
      return "psk";
    case PeerAuthentication::kCertificate:
      return "certificate";
  }
  return "none";
}

void check_timing(const CoapTiming& timing) {
  // libcoap ignores values it does not accept (an ACK_TIMEOUT below 1 s among them)
  // without a word, so they are refused here.
  if (!(timing.ack_timeout_seconds >= 1.0 && timing.ack_timeout_seconds <= 60.0))
    throw std::invalid_argument(
        "CoAP ACK_TIMEOUT must be 1..60 seconds (libcoap 4.3.1 takes nothing below 1 s)");
  if (!(timing.ack_random_factor >= 1.0 && timing.ack_random_factor <= 4.0))
    throw std::invalid_argument("CoAP ACK_RANDOM_FACTOR must be 1..4");
  if (timing.max_retransmit < 1 || timing.max_retransmit > 10)
    throw std::invalid_argument("CoAP MAX_RETRANSMIT must be 1..10");
  if (timing.nstart < 1 || timing.nstart > 16)
    throw std::invalid_argument("CoAP NSTART must be 1..16");
  if (timing.max_payloads < 1 || timing.max_payloads > 64)
    throw std::invalid_argument("Q-Block MAX_PAYLOADS must be 1..64");
}

std::optional<QBlockValue> decode_q_block(const coap_opt_t* option) {
  const std::size_t length = coap_opt_length(option);
  if (length > 3) return std::nullopt;  // RFC 9177 2.2: 0 to 3 bytes, as Block1/Block2
  const std::uint32_t value = coap_decode_var_bytes(coap_opt_value(option), length);
  QBlockValue block{value >> 4, ((value >> 3) & 1) != 0, value & 7};
  if (block.szx == 7) return std::nullopt;  // BERT is for reliable transports only
  return block;
}

std::size_t encode_q_block(std::uint8_t (&buffer)[4], const QBlockValue& block) {
  return coap_encode_var_safe(buffer, sizeof buffer,
                              (block.num << 4) | (block.more ? 8u : 0u) | block.szx);
}

namespace {
// RFC 9177 5's missing-blocks list: a CBOR sequence of unsigned integers (at most 1,024).
bool decode_cbor_unsigned_sequence(std::span<const std::uint8_t> bytes,
                                   std::vector<std::uint32_t>& values) {
  std::size_t i = 0;
  while (i < bytes.size()) {
    const std::uint8_t head = bytes[i++];
    if (head >> 5 != 0 || values.size() >= 1024) return false;  // major type 0 only
    const std::uint8_t info = head & 31;
    std::size_t extra = info < 24 ? 0 : info == 24 ? 1 : info == 25 ? 2 : info == 26 ? 4 : 9;
    if (extra == 9 || bytes.size() - i < extra) return false;
    std::uint32_t value = info < 24 ? info : 0;
    for (std::size_t k = 0; k < extra; ++k) value = (value << 8) | bytes[i++];
    values.push_back(value);
  }
  return !values.empty();
}
}  // namespace

bool QBlock1Sender::start(coap_session_t* session, std::span<const std::uint8_t> body,
                          std::vector<std::uint8_t> token, std::size_t max_payloads,
                          double ack_timeout_seconds, NewRequest new_request) {
  reset();
  active_ = true;
  session_ = session;
  body_ = body;
  token_ = std::move(token);
  max_payloads_ = std::max<std::size_t>(1, max_payloads);
  non_receive_timeout_ = std::chrono::duration<double>(2 * ack_timeout_seconds);
  new_request_ = std::move(new_request);
  blocks_ = static_cast<std::uint32_t>((body.size() + 1023) / 1024);
  return send_burst();
}

QBlock1Sender::Answer QBlock1Sender::take_answer(const coap_pdu_t* received) {
  const coap_pdu_code_t code = coap_pdu_get_code(received);
  if (code == COAP_RESPONSE_CODE(402) && !progressed_) return Answer::kRefused;
  if (code == COAP_RESPONSE_CODE(231)) {
    progressed_ = continued_ = true;
    last_heard_ = std::chrono::steady_clock::now();
    return Answer::kContinue;
  }
  if (code != COAP_RESPONSE_CODE(408)) return Answer::kFinal;
  size_t length = 0;
  const uint8_t* data = nullptr;
  coap_get_data(received, &length, &data);
  std::vector<std::uint32_t> missing;
  if (!decode_cbor_unsigned_sequence({data, length}, missing) ||
      std::any_of(missing.begin(), missing.end(), [&](std::uint32_t n) { return n >= blocks_; }))
    return Answer::kFinal;  // not a list of ours: the answer to the body, 4.08 as it is
  progressed_ = true;
  last_heard_ = std::chrono::steady_clock::now();
  for (std::uint32_t n : missing)
    if (std::find(resend_.begin(), resend_.end(), n) == resend_.end()) resend_.push_back(n);
  return Answer::kMissing;
}

bool QBlock1Sender::send_block(std::uint32_t num, bool confirmable) {
  constexpr std::size_t kBlock = 1024;
  const std::size_t offset = std::size_t{num} * kBlock;
  const std::size_t length = std::min(kBlock, body_.size() - offset);
  const bool last = num + 1 == blocks_;
  coap_pdu_t* pdu = new_request_(last || confirmable ? COAP_MESSAGE_CON : COAP_MESSAGE_NON);
  if (!pdu) {
    failed_block_ = num;
    return false;
  }
  std::uint8_t buffer[8];
  coap_add_option(pdu, COAP_OPTION_SIZE1,
                  coap_encode_var_safe8(buffer, sizeof buffer, body_.size()), buffer);
  std::uint8_t block[4];
  coap_add_option(pdu, kOptionQBlock1, encode_q_block(block, {num, !last, 6}), block);
  coap_add_data(pdu, length, body_.data() + offset);
  if (coap_send(session_, pdu) == COAP_INVALID_MID) {
    failed_block_ = num;
    return false;
  }
  return true;
}

bool QBlock1Sender::send_burst() {
  const std::uint32_t end = static_cast<std::uint32_t>(
      std::min<std::size_t>(blocks_, next_unsent_ + max_payloads_));
  bool sent = true;
  for (std::uint32_t n = next_unsent_; n < end && sent; ++n) sent = send_block(n, false);
  burst_end_ = end - 1;
  next_unsent_ = end;
  last_heard_ = std::chrono::steady_clock::now();
  return sent;
}

bool QBlock1Sender::step(std::chrono::steady_clock::time_point now) {
  if (!active_) return true;
  bool sent = true;
  if (!resend_.empty()) {
    std::sort(resend_.begin(), resend_.end());
    for (std::uint32_t n : resend_) sent = sent && send_block(n, false);
    resend_.clear();
    last_heard_ = now;
  }
  if (continued_) {
    continued_ = false;
    if (next_unsent_ < blocks_) sent = sent && send_burst();
    return sent;
  }
  if (now - last_heard_ > non_receive_timeout_) {
    sent = sent && send_block(burst_end_, true);
    last_heard_ = now;
  }
  return sent;
}

coap_address_t resolve_udp_address(const std::string& host, std::uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0 || !found) {
    throw TransportError("cannot resolve '" + host + "': " + gai_strerror(rc));
  }
  coap_address_t address;
  coap_address_init(&address);
  address.size = found->ai_addrlen;
  std::memcpy(&address.addr.sa, found->ai_addr, found->ai_addrlen);
  freeaddrinfo(found);
  return address;
}

std::string tls_library_description() {
  coap_library_startup();
  const coap_tls_version_t* version = coap_get_tls_library_version();
  std::string name;
  switch (version->type) {
    case COAP_TLS_LIBRARY_MBEDTLS:
      name = "Mbed TLS";
      break;
    case COAP_TLS_LIBRARY_OPENSSL:
      name = "OpenSSL";
      break;
    case COAP_TLS_LIBRARY_GNUTLS:
      name = "GnuTLS";
      break;
    case COAP_TLS_LIBRARY_TINYDTLS:
      name = "TinyDTLS";
      break;
    default:
      return "no (D)TLS";
  }
  if (version->type == COAP_TLS_LIBRARY_MBEDTLS) {
    // Mbed TLS encodes its version as 0xMMmmpp00.
    const auto v = version->version;
    name += " " + std::to_string((v >> 24) & 0xff) + "." + std::to_string((v >> 16) & 0xff) + "." +
            std::to_string((v >> 8) & 0xff);
  }
  return name;
}

bool tls_library_is_mbedtls() {
  coap_library_startup();
  return coap_get_tls_library_version()->type == COAP_TLS_LIBRARY_MBEDTLS;
}

std::string coap_code_string(int code) {
  std::string detail = std::to_string(code % 100);
  if (detail.size() < 2) detail.insert(0, "0");
  return std::to_string(code / 100) + "." + detail;
}

}  // namespace edgetrain::transport
