// Mutual HMAC-SHA256 challenge-response over a connected socket (DESIGN.md section 5).
//
// Both ends share a token. The exchange, with role-bound proofs so that one side's
// proof can never be reflected back as the other's:
//   both:   hello   = magic "pltA", version u16 LE, role u8, 0 u8, nonce[32] (RAND_bytes)
//   client: proof_c = HMAC(token, label || 'c' || nonce_c || nonce_s || len(context) || context)
//   server: checks proof_c (CRYPTO_memcmp), then replies
//           verdict = status u8 (0 accepted, 1 rejected) || proof_s (HMAC as above with 's',
//                     nonce_s first; zeros when rejected)
//   client: checks proof_s.
// The server proves nothing to a client that has not proved itself first, so it is
// never an oracle for unauthenticated connections; fresh nonces on both sides make a
// recorded handshake useless for a replay. Garbage is rejected after its first 8 bytes.
// A wrong token fails with errc::auth on both sides; I/O failures are timeout/peer_lost.
//
// auth_exchange is the handshake as a state machine, for poll() loops on non-blocking
// sockets: it says how many bytes to send and to receive next and never asks for more
// than the handshake needs, so bytes that follow it on the socket stay unread.
// authenticate() drives it with blocking send_all/recv_all. Neither keeps global
// state; an auth_exchange is used by one thread and refers to (does not copy) the token.
#pragma once

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <plait/detail/socket.hpp>
#include <plait/error.hpp>
#include <plait/transport.hpp>

namespace plait::bootstrap {

enum class auth_role : std::uint8_t { client, server };

namespace auth_detail {

inline constexpr std::array<std::byte, 4> magic = {std::byte{'p'}, std::byte{'l'}, std::byte{'t'}, std::byte{'A'}};
inline constexpr std::uint16_t version = 1;
inline constexpr std::size_t nonce_bytes = 32;
inline constexpr std::size_t mac_bytes = 32;  // SHA-256
inline constexpr std::size_t hello_header_bytes = 8;
inline constexpr std::size_t verdict_bytes = 1 + mac_bytes;
inline constexpr std::string_view label = "plait-auth-v1";

inline std::byte role_byte(auth_role r) {
  return std::byte{r == auth_role::client ? std::uint8_t{'c'} : std::uint8_t{'s'}};
}

inline void random_bytes(std::span<std::byte> out) {
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(out.size())) != 1)
    throw error(errc::system, "RAND_bytes failed: the system random generator is unavailable");
}

// HMAC(token, label || role || prover_nonce || verifier_nonce || u32 LE len(context) || context)
inline std::array<std::byte, mac_bytes> proof(std::span<const std::byte> token, auth_role prover,
                                              std::span<const std::byte> prover_nonce,
                                              std::span<const std::byte> verifier_nonce, std::string_view context) {
  std::vector<unsigned char> msg;
  msg.reserve(label.size() + 1 + 2 * nonce_bytes + 4 + context.size());
  msg.insert(msg.end(), label.begin(), label.end());
  msg.push_back(static_cast<unsigned char>(role_byte(prover)));
  auto append = [&](std::span<const std::byte> s) {
    auto* p = reinterpret_cast<const unsigned char*>(s.data());
    msg.insert(msg.end(), p, p + s.size());
  };
  append(prover_nonce);
  append(verifier_nonce);
  auto n = static_cast<std::uint32_t>(context.size());
  for (int i = 0; i < 4; ++i) msg.push_back(static_cast<unsigned char>(n >> (8 * i)));
  msg.insert(msg.end(), context.begin(), context.end());

  std::array<std::byte, mac_bytes> out{};
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()), msg.data(), msg.size(),
            reinterpret_cast<unsigned char*>(out.data()), &len) ||
      len != mac_bytes)
    throw error(errc::system, "HMAC-SHA256 failed in libcrypto");
  return out;
}

}  // namespace auth_detail

class auth_exchange {
 public:
  // The token must outlive the exchange. Throws invalid_argument on an empty token.
  auth_exchange(std::span<const std::byte> token, auth_role role, std::string_view context)
      : token_(token), role_(role), context_(context) {
    using namespace auth_detail;
    if (token.empty()) throw error(errc::invalid_argument, "authentication needs a non-empty token");
    random_bytes(own_nonce_);
    out_.insert(out_.end(), magic.begin(), magic.end());
    out_.push_back(std::byte{static_cast<std::uint8_t>(version & 0xff)});
    out_.push_back(std::byte{static_cast<std::uint8_t>(version >> 8)});
    out_.push_back(std::byte{static_cast<std::uint8_t>(role)});
    out_.push_back(std::byte{0});
    out_.insert(out_.end(), own_nonce_.begin(), own_nonce_.end());
    expect(stage::hello_header, hello_header_bytes);
  }
  ~auth_exchange() { OPENSSL_cleanse(in_.data(), in_.size()); }
  auth_exchange(const auth_exchange&) = delete;
  auth_exchange& operator=(const auth_exchange&) = delete;

  // Bytes to send now (possibly empty); report progress with consume_output().
  std::span<const std::byte> pending_output() const { return std::span<const std::byte>(out_).subspan(out_sent_); }
  void consume_output(std::size_t n) {
    out_sent_ += n;
    if (out_sent_ == out_.size()) {
      out_.clear();
      out_sent_ = 0;
    }
  }

  // Where the next received bytes go (empty when nothing is expected). Receive at
  // most this many bytes, then report them with commit_input().
  std::span<std::byte> input_space() {
    if (stage_ == stage::finished) return {};
    return std::span<std::byte>(in_).subspan(in_have_);
  }
  void commit_input(std::size_t n) {
    in_have_ += n;
    if (in_have_ == in_.size()) on_message();
  }

  // Nothing left to send or receive: the handshake succeeded or failed (check()).
  bool finished() const { return stage_ == stage::finished && out_.empty(); }
  bool failed() const { return failure_.has_value(); }
  // Throws the failure, if any (errc::auth).
  void check() const {
    if (failure_) throw error(errc::auth, *failure_);
  }

 private:
  enum class stage { hello_header, hello_nonce, client_proof, verdict, finished };

  void expect(stage s, std::size_t n) {
    stage_ = s;
    in_.assign(n, std::byte{0});
    in_have_ = 0;
  }
  void fail(std::string why) {
    failure_ = "authentication (" + context_ + ") failed: " + std::move(why);
    stage_ = stage::finished;
  }

  void on_message() {
    using namespace auth_detail;
    switch (stage_) {
      case stage::hello_header: {
        if (std::memcmp(in_.data(), magic.data(), magic.size()) != 0)
          return fail(
              "the peer did not start a plait handshake (bad magic); something other than a "
              "plait rank or store connected");
        auto v =
            static_cast<std::uint16_t>(std::to_integer<unsigned>(in_[4]) | (std::to_integer<unsigned>(in_[5]) << 8));
        if (v != version)
          return fail("the peer speaks handshake version " + std::to_string(v) + ", this build speaks " +
                      std::to_string(version) + "; use the same plait version on every rank");
        auto peer_role = std::to_integer<std::uint8_t>(in_[6]);
        if (peer_role > 1 || in_[7] != std::byte{0}) return fail("malformed handshake header");
        if (peer_role == static_cast<std::uint8_t>(role_))
          return fail("both ends claim the same role; one side must accept and the other connect");
        return expect(stage::hello_nonce, nonce_bytes);
      }
      case stage::hello_nonce:
        std::memcpy(peer_nonce_.data(), in_.data(), nonce_bytes);
        if (role_ == auth_role::client) {
          auto p = proof(token_, auth_role::client, own_nonce_, peer_nonce_, context_);
          out_.insert(out_.end(), p.begin(), p.end());
          return expect(stage::verdict, verdict_bytes);
        }
        return expect(stage::client_proof, mac_bytes);
      case stage::client_proof: {
        auto want = proof(token_, auth_role::client, peer_nonce_, own_nonce_, context_);
        bool ok = CRYPTO_memcmp(want.data(), in_.data(), mac_bytes) == 0;
        out_.push_back(std::byte{ok ? std::uint8_t{0} : std::uint8_t{1}});
        if (!ok) {
          out_.insert(out_.end(), mac_bytes, std::byte{0});
          return fail(
              "the connecting peer does not hold this job's token (its proof is wrong); "
              "every rank must use the same PLAIT_TOKEN / PLAIT_TOKEN_FILE");
        }
        auto p = proof(token_, auth_role::server, own_nonce_, peer_nonce_, context_);
        out_.insert(out_.end(), p.begin(), p.end());
        stage_ = stage::finished;
        return;
      }
      case stage::verdict: {
        auto status = std::to_integer<std::uint8_t>(in_[0]);
        if (status == 1)
          return fail(
              "the peer rejected this rank's token; every rank must use the same "
              "PLAIT_TOKEN / PLAIT_TOKEN_FILE (plaitrun sets one per job)");
        if (status != 0) return fail("malformed handshake verdict");
        auto want = proof(token_, auth_role::server, peer_nonce_, own_nonce_, context_);
        if (CRYPTO_memcmp(want.data(), in_.data() + 1, mac_bytes) != 0)
          return fail(
              "the accepting peer does not hold this job's token (its proof is wrong); "
              "every rank must use the same PLAIT_TOKEN / PLAIT_TOKEN_FILE");
        stage_ = stage::finished;
        return;
      }
      case stage::finished:
        return;
    }
  }

  std::span<const std::byte> token_;
  auth_role role_;
  std::string context_;
  std::array<std::byte, auth_detail::nonce_bytes> own_nonce_{};
  std::array<std::byte, auth_detail::nonce_bytes> peer_nonce_{};
  std::vector<std::byte> out_;
  std::size_t out_sent_ = 0;
  std::vector<std::byte> in_;
  std::size_t in_have_ = 0;
  stage stage_ = stage::hello_header;
  std::optional<std::string> failure_;
};

// Runs the whole handshake on fd (blocking or non-blocking) before the deadline.
// Returns on success; throws errc::auth on a wrong token or garbage, timeout or
// peer_lost on I/O. Both ends must pass the same context string.
inline void authenticate(int fd, std::span<const std::byte> token, auth_role role, std::string_view context,
                         clock::time_point deadline) {
  auth_exchange ex(token, role, context);
  while (!ex.finished()) {
    if (auto out = ex.pending_output(); !out.empty()) {
      detail::send_all(fd, out.data(), out.size(), deadline);
      ex.consume_output(out.size());
      continue;
    }
    auto in = ex.input_space();
    if (in.empty()) break;
    detail::recv_all(fd, in.data(), in.size(), deadline);
    ex.commit_input(in.size());
  }
  ex.check();
}

}  // namespace plait::bootstrap
