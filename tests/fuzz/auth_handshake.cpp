// libFuzzer harness: the authentication handshake's state machine
// (bootstrap::auth_exchange) fed whatever the other end may send.
//
// Input: one configuration byte (bit 0: this side is the server; bit 1: which context
// string), two chunk-size bytes, then the peer's bytes. They go in through
// input_space()/commit_input() in those chunks, and everything the exchange wants to
// send is taken as soon as it offers it, as a poll() loop would. The peer's proof
// cannot be guessed (it binds this side's fresh nonce), so the harness XORs the input
// bytes in the proof position with the correct proof: zero bytes there are a valid
// proof, and the success path is as reachable as any failure. Oracle: the exchange
// succeeds exactly when the bytes form a correct handshake, never reads past its
// end, and a failure is errc::auth.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string_view>
#include <vector>

#include <plait/bootstrap/auth.hpp>

#include "fuzz_input.hpp"

namespace {

namespace ad = plait::bootstrap::auth_detail;
using plait::bootstrap::auth_exchange;
using plait::bootstrap::auth_role;
using plait::fuzz::require;

constexpr std::size_t hello_bytes = ad::hello_header_bytes + ad::nonce_bytes;

const std::vector<std::byte>& token() {
  static const std::vector<std::byte> t(24, std::byte{0x33});
  return t;
}

// Everything the exchange offers to send, appended to `sent`.
void take_output(auth_exchange& ex, std::vector<std::uint8_t>& sent) {
  for (auto out = ex.pending_output(); !out.empty(); out = ex.pending_output()) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(out.data());
    sent.insert(sent.end(), p, p + out.size());
    ex.consume_output(out.size());
  }
}

void run(const std::uint8_t* data, std::size_t size) {
  plait::fuzz::fuzz_input in(data, size);
  const std::uint8_t cfg = in.take_byte();
  const auth_role role = (cfg & 1u) ? auth_role::server : auth_role::client;
  const auth_role peer_role = role == auth_role::server ? auth_role::client : auth_role::server;
  const std::string_view context = (cfg & 2u) ? std::string_view("plait-tcp") : std::string_view("plait-store");
  in.take_schedule(2);
  const std::size_t header_bytes = size < 3 ? size : 3;
  const std::uint8_t* peer = data + header_bytes;

  // The peer's stream: hello, then the client's proof or the server's verdict + proof.
  const std::size_t proof_at = role == auth_role::server ? hello_bytes : hello_bytes + 1;
  const std::size_t total = proof_at + ad::mac_bytes;

  auth_exchange ex(token(), role, context);
  std::vector<std::uint8_t> sent, fed;
  std::array<std::byte, ad::mac_bytes> proof{};
  std::size_t consumed = 0;
  std::span<const std::uint8_t> chunk;  // what is left of the current chunk
  while (!chunk.empty() || in.stream_left()) {
    take_output(ex, sent);
    const auto space = ex.input_space();
    if (space.empty()) break;
    require(space.size() <= total - consumed, "the exchange asks for more bytes than the handshake has");
    if (chunk.empty()) chunk = in.next_chunk();
    // A chunk longer than the space is cut there; the rest stays for the next round,
    // as unread bytes stay in a socket.
    const std::size_t n = std::min(space.size(), chunk.size());
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t at = consumed + i;
      if (at == proof_at) {  // both nonces are known once the proof starts
        require(sent.size() >= hello_bytes, "this side's hello was not offered before the proof was due");
        const std::span<const std::byte> mine(reinterpret_cast<const std::byte*>(sent.data()) + 8, ad::nonce_bytes);
        const std::span<const std::byte> theirs(reinterpret_cast<const std::byte*>(fed.data()) + 8, ad::nonce_bytes);
        proof = ad::proof(token(), peer_role, theirs, mine, context);
      }
      std::uint8_t b = chunk[i];
      if (at >= proof_at && at < total) b ^= std::to_integer<std::uint8_t>(proof[at - proof_at]);
      fed.push_back(b);
    }
    std::memcpy(space.data(), fed.data() + consumed, n);
    ex.commit_input(n);
    consumed += n;
    chunk = chunk.subspan(n);
  }
  take_output(ex, sent);
  require(ex.finished() || !ex.input_space().empty(), "the exchange neither finished nor asks for input");

  // The oracle: success exactly when every byte the peer sent is a correct handshake,
  // that is a well-formed hello with the other role, a zero verdict (to a client), and
  // zero input bytes in the proof's place.
  bool correct = consumed == total;
  if (correct) {
    const std::uint8_t want[8] = {'p', 'l', 't', 'A', 1, 0, static_cast<std::uint8_t>(peer_role), 0};
    correct = std::memcmp(fed.data(), want, 8) == 0;
  }
  if (correct && role == auth_role::client) correct = fed[hello_bytes] == 0;
  for (std::size_t i = proof_at; correct && i < total; ++i) correct = peer[i] == 0;

  if (correct) {
    require(ex.finished() && !ex.failed(), "a correct handshake did not succeed");
    require(sent.size() == (role == auth_role::server ? hello_bytes + 1 + ad::mac_bytes : hello_bytes + ad::mac_bytes),
            "a successful handshake sent the wrong number of bytes");
  } else if (ex.finished()) {
    require(ex.failed(), "a wrong handshake succeeded");
  }
  if (ex.failed()) {
    require(ex.finished() && ex.input_space().empty(), "a failed exchange still asks for input");
    bool threw = false;
    try {
      ex.check();
    } catch (const plait::error& e) {
      threw = e.code() == plait::errc::auth;
    }
    require(threw, "a failed exchange did not throw errc::auth");
  } else {
    ex.check();  // must not throw
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    run(data, size);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unexpected exception: %s\n", e.what());
    std::abort();
  }
  return 0;
}
