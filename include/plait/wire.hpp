// The slot header: what every slot carries on every transport, from the first byte.
//
// A slot is a fixed-size buffer in a per-peer FIFO (see transport.hpp). Its header
// names the call it belongs to (call_desc: sequence number, collective, element type,
// count, op, root, algorithm, slice size), so a receiver checks every slot against
// the call it is running and reports `mismatch` naming both sides instead of hanging
// or reading the wrong data. The layout is fixed-size and trivially copyable, so it
// is written as-is into shared memory and onto sockets; validate() is the single
// place where bytes from a peer are turned into a header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace plait::detail {

enum class collective_kind : std::uint8_t {
  none = 0,
  all_reduce,
  all_gather,
  reduce_scatter,
  broadcast,
  reduce,
  all_to_all,
  barrier,
  point_to_point,
};

inline const char* to_string(collective_kind k) noexcept {
  switch (k) {
    case collective_kind::none:
      return "none";
    case collective_kind::all_reduce:
      return "all_reduce";
    case collective_kind::all_gather:
      return "all_gather";
    case collective_kind::reduce_scatter:
      return "reduce_scatter";
    case collective_kind::broadcast:
      return "broadcast";
    case collective_kind::reduce:
      return "reduce";
    case collective_kind::all_to_all:
      return "all_to_all";
    case collective_kind::barrier:
      return "barrier";
    case collective_kind::point_to_point:
      return "send/recv";
  }
  return "?";
}

// What a call is, as every participating rank must agree on it.
struct call_desc {
  std::uint64_t sequence = 0;     // collective number on the communicator (p2p: per-pair number)
  std::uint64_t count = 0;        // elements (per rank for all_gather's shard / reduce_scatter's shard)
  std::uint32_t slice_bytes = 0;  // pipeline slice size
  std::int32_t root = -1;         // broadcast / reduce root, -1 otherwise
  collective_kind kind = collective_kind::none;
  std::uint8_t dtype = 0;      // plait::dtype
  std::uint8_t op = 0;         // op id (0 = none/copy)
  std::uint8_t algorithm = 0;  // 1 ring, 2 tree, 3 direct, 4 recursive doubling; 128-255 outside the library
  std::uint32_t reserved = 0;

  friend bool operator==(const call_desc&, const call_desc&) = default;
};
static_assert(sizeof(call_desc) == 32);

inline constexpr std::uint32_t slot_magic = 0x504c5431;  // "PLT1"
inline constexpr std::uint16_t wire_version = 1;

enum slot_flags : std::uint16_t {
  slot_data = 0,
  slot_error_notice = 1,  // the sender failed this call (invalid_argument); no payload
  // The payload is still in the sender's memory at address `reserved` (shm single
  // copy); the receiver copies it from there, and the sender keeps it until the slot
  // is released. A sender that fails first copies the payload into the slot and
  // clears this flag (link_set::detach), so the slot alone is then the truth.
  slot_by_reference = 2,
  // The payload is in the sender's staging pool, chunk `reserved` (shm: one copy
  // read by several peers, link_set::stage); the receiver reads it there and frees
  // its hold on the chunk when it releases the slot.
  slot_staged = 4,
};

struct slot_header {
  std::uint32_t magic = slot_magic;
  std::uint16_t version = wire_version;
  std::uint16_t flags = slot_data;
  std::uint32_t bytes = 0;   // payload bytes that follow the header
  std::int32_t sender = -1;  // sender's rank
  std::uint64_t offset = 0;  // element offset of this slice within its block (diagnostics)
  std::uint64_t reserved = 0;
  call_desc desc;
};
static_assert(sizeof(slot_header) == 64);

// Why two call descriptions differ, in words: "count 12 vs 13".
inline std::string describe_difference(const call_desc& mine, const call_desc& theirs) {
  std::string s;
  auto add = [&](const char* what, std::string a, std::string b) {
    if (!s.empty()) s += ", ";
    s += what;
    s += " ";
    s += a;
    s += " here vs ";
    s += b;
  };
  if (mine.sequence != theirs.sequence) add("sequence", std::to_string(mine.sequence), std::to_string(theirs.sequence));
  if (mine.kind != theirs.kind) add("collective", to_string(mine.kind), to_string(theirs.kind));
  if (mine.dtype != theirs.dtype) add("dtype id", std::to_string(mine.dtype), std::to_string(theirs.dtype));
  if (mine.count != theirs.count) add("count", std::to_string(mine.count), std::to_string(theirs.count));
  if (mine.op != theirs.op) add("op id", std::to_string(mine.op), std::to_string(theirs.op));
  if (mine.root != theirs.root) add("root", std::to_string(mine.root), std::to_string(theirs.root));
  if (mine.algorithm != theirs.algorithm)
    add("algorithm id", std::to_string(mine.algorithm), std::to_string(theirs.algorithm));
  if (mine.slice_bytes != theirs.slice_bytes)
    add("slice bytes", std::to_string(mine.slice_bytes), std::to_string(theirs.slice_bytes));
  return s.empty() ? std::string("identical descriptions") : s;
}

}  // namespace plait::detail
