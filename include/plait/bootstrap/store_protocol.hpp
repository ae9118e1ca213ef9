// Wire format of the bootstrap key-value store (store_server / store_client).
//
// After the auth handshake (auth.hpp, context "plait-store"), the client sends
// requests and the server answers each with one response carrying the request's id.
//   request  (24 bytes): magic "pltS" | version u8 | op u8 | 0 u16 | id u32 | key_len u32 | value_len u64
//                        followed by key_len key bytes and value_len value bytes
//   response (20 bytes): magic "pltR" | version u8 | status u8 | 0 u16 | id u32 | value_len u64
//                        followed by value_len bytes
// Integers are little-endian. A client sends one request at a time; a GET waits in
// the server until the key exists, and any later request on the same connection
// cancels a GET still waiting (the client gave up on it), so a client discards a
// response whose id is not that of its current request.
// Caps (a request breaking one gets the connection closed, never an allocation):
// key 1..512 bytes, value <= 16 MiB. Store-wide caps (256 MiB stored, 65536 keys)
// answer status::refused with a message instead, since an honest job can reach them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

namespace plait::bootstrap::store_protocol {

inline constexpr std::string_view auth_context = "plait-store";
inline constexpr std::array<std::byte, 4> request_magic = {std::byte{'p'}, std::byte{'l'}, std::byte{'t'},
                                                           std::byte{'S'}};
inline constexpr std::array<std::byte, 4> response_magic = {std::byte{'p'}, std::byte{'l'}, std::byte{'t'},
                                                            std::byte{'R'}};
inline constexpr std::uint8_t version = 1;
inline constexpr std::size_t request_header_bytes = 24;
inline constexpr std::size_t response_header_bytes = 20;

inline constexpr std::size_t max_key_bytes = 512;
inline constexpr std::size_t max_value_bytes = std::size_t{16} << 20;
inline constexpr std::size_t max_total_bytes = std::size_t{256} << 20;
inline constexpr std::size_t max_keys = 65536;
inline constexpr std::size_t max_connections = 1024;
inline constexpr std::size_t max_pending_handshakes = 128;

// The server publishes a random id of itself under this key at start-up
// (job keys for shm names derive from it).
inline constexpr std::string_view instance_key = "plait/instance";

enum class op : std::uint8_t {
  set = 1,      // key, value          -> ok
  get = 2,      // key (waits)         -> ok + value
  add = 3,      // key, int64 LE delta -> ok + new int64 LE value (refused if not 8 bytes)
  del = 4,      // key                 -> ok (absent keys too)
  try_get = 5,  // key (no wait)       -> ok + value, or not_found
};

enum class status : std::uint8_t {
  ok = 0,
  not_found = 1,
  refused = 2,  // value holds the reason as text
};

inline void put_u16(std::byte* p, std::uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = std::byte{static_cast<std::uint8_t>(v >> (8 * i))};
}
inline void put_u32(std::byte* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = std::byte{static_cast<std::uint8_t>(v >> (8 * i))};
}
inline void put_u64(std::byte* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = std::byte{static_cast<std::uint8_t>(v >> (8 * i))};
}
inline std::uint64_t get_le(const std::byte* p, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= std::uint64_t{std::to_integer<std::uint8_t>(p[i])} << (8 * i);
  return v;
}

struct request_header {
  op opcode{};
  std::uint32_t id = 0;
  std::uint32_t key_len = 0;
  std::uint64_t value_len = 0;
};

struct response_header {
  status code{};
  std::uint32_t id = 0;
  std::uint64_t value_len = 0;
};

inline std::array<std::byte, request_header_bytes> encode(const request_header& h) {
  std::array<std::byte, request_header_bytes> b{};
  std::memcpy(b.data(), request_magic.data(), 4);
  b[4] = std::byte{version};
  b[5] = std::byte{static_cast<std::uint8_t>(h.opcode)};
  put_u32(&b[8], h.id);
  put_u32(&b[12], h.key_len);
  put_u64(&b[16], h.value_len);
  return b;
}

inline std::array<std::byte, response_header_bytes> encode(const response_header& h) {
  std::array<std::byte, response_header_bytes> b{};
  std::memcpy(b.data(), response_magic.data(), 4);
  b[4] = std::byte{version};
  b[5] = std::byte{static_cast<std::uint8_t>(h.code)};
  put_u32(&b[8], h.id);
  put_u64(&b[12], h.value_len);
  return b;
}

// Validates framing and caps; returns false for anything a correct client never sends.
inline bool decode(std::span<const std::byte, request_header_bytes> b, request_header& h) {
  if (std::memcmp(b.data(), request_magic.data(), 4) != 0) return false;
  if (b[4] != std::byte{version} || b[6] != std::byte{0} || b[7] != std::byte{0}) return false;
  auto code = std::to_integer<std::uint8_t>(b[5]);
  if (code < 1 || code > 5) return false;
  h.opcode = static_cast<op>(code);
  h.id = static_cast<std::uint32_t>(get_le(&b[8], 4));
  h.key_len = static_cast<std::uint32_t>(get_le(&b[12], 4));
  h.value_len = get_le(&b[16], 8);
  if (h.key_len == 0 || h.key_len > max_key_bytes || h.value_len > max_value_bytes) return false;
  switch (h.opcode) {
    case op::set:
      return true;
    case op::add:
      return h.value_len == 8;
    case op::get:
    case op::del:
    case op::try_get:
      return h.value_len == 0;
  }
  return false;
}

inline bool decode(std::span<const std::byte, response_header_bytes> b, response_header& h) {
  if (std::memcmp(b.data(), response_magic.data(), 4) != 0) return false;
  if (b[4] != std::byte{version} || b[6] != std::byte{0} || b[7] != std::byte{0}) return false;
  auto code = std::to_integer<std::uint8_t>(b[5]);
  if (code > 2) return false;
  h.code = static_cast<status>(code);
  h.id = static_cast<std::uint32_t>(get_le(&b[8], 4));
  h.value_len = get_le(&b[12], 8);
  return h.value_len <= max_value_bytes;
}

}  // namespace plait::bootstrap::store_protocol
