// Shared inside transport/ only (it exposes libcoap): turning a host and port into the
// address libcoap wants.
#pragma once

#include <coap3/coap.h>

#include <cstdint>
#include <string>

namespace edgetrain::transport {

// getaddrinfo() for UDP; throws TransportError naming the host when it cannot be resolved.
coap_address_t resolve_udp_address(const std::string& host, std::uint16_t port);

}  // namespace edgetrain::transport
