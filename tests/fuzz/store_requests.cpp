// libFuzzer harness: the bootstrap store's request handling (store_server and
// store_protocol::decode) fed whatever an authenticated client may send.
//
// Input: one configuration byte (bit 0: small store-wide caps, so refusals are
// reachable; bit 1: a second client waits in a GET for key "w" before the stream
// starts, so a SET in the stream wakes it), four chunk-size bytes, then the client's
// byte stream after the handshake. Each input starts a fresh server on 127.0.0.1, connects, authenticates,
// writes the stream in those chunks while reading responses, half-closes, and reads
// until the server closes. A model of the protocol, written from store_protocol.hpp's
// contract, parses the same stream and says which responses must come back: exactly
// those, in order, and then the end of the connection. Anything else (a crash, a
// hang past the deadline, a wrong or missing response, a response to a request that
// should have closed the connection) aborts.
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <plait/bootstrap/store_server.hpp>

#include "fuzz_input.hpp"

namespace {

namespace proto = plait::bootstrap::store_protocol;
using plait::fuzz::require;
using bytes = std::vector<std::uint8_t>;

struct expected_response {
  proto::status code;
  std::uint32_t id;
  std::optional<bytes> value;    // checked when set; refusals carry text we do not compare
  std::size_t any_value_of = 0;  // the instance id: random, only its length is known
};

std::uint64_t le(const std::uint8_t* p, int n) {
  std::uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= std::uint64_t{p[i]} << (8 * i);
  return v;
}

// The store as the protocol describes it, with the server's instance key in place.
class store_model {
 public:
  store_model(std::size_t max_total, std::size_t max_keys) : max_total_(max_total), max_keys_(max_keys) {
    const std::string key(proto::instance_key);
    data_[key] = bytes(32, 0);
    instance_unknown_ = true;
    total_ = key.size() + 32;
  }

  static constexpr std::string_view watched_key = "w";
  // What a GET for watched_key, waiting since before the stream, is woken with.
  const std::optional<bytes>& first_watched() const { return first_watched_; }
  // The stream holds a request a correct client never sends: the server closes the
  // connection when it reads it.
  bool closes() const { return closes_; }

  // Responses to every request the server must accept, in order. Parsing stops at the
  // first request a correct client never sends (the server closes the connection).
  std::vector<expected_response> run(const std::uint8_t* p, std::size_t n) {
    std::vector<expected_response> out;
    std::size_t pos = 0;
    while (n - pos >= proto::request_header_bytes) {
      const std::uint8_t* h = p + pos;
      const unsigned op = h[5];
      const auto id = static_cast<std::uint32_t>(le(h + 8, 4));
      const std::uint64_t key_len = le(h + 12, 4), value_len = le(h + 16, 8);
      closes_ = std::memcmp(h, "pltS", 4) != 0 || h[4] != proto::version || h[6] != 0 || h[7] != 0 || op < 1 ||
                op > 5 || key_len == 0 || key_len > 512 || value_len > (std::uint64_t{16} << 20) ||
                (op == 3 ? value_len != 8 : (op != 1 && value_len != 0));
      if (closes_) break;
      if (n - pos - proto::request_header_bytes < key_len + value_len) break;  // incomplete at the end
      const std::uint8_t* k = h + proto::request_header_bytes;
      const std::string key(reinterpret_cast<const char*>(k), key_len);
      const bytes value(k + key_len, k + key_len + value_len);
      pos += proto::request_header_bytes + key_len + value_len;
      apply(op, id, key, value, out);
    }
    return out;
  }

 private:
  void apply(unsigned op, std::uint32_t id, const std::string& key, const bytes& value,
             std::vector<expected_response>& out) {
    auto it = data_.find(key);
    const bool instance = key == proto::instance_key && instance_unknown_;
    switch (op) {
      case 1:  // set
        out.push_back(store(key, value) ? expected_response{proto::status::ok, id, bytes{}}
                                        : expected_response{proto::status::refused, id, std::nullopt});
        return;
      case 2:  // get: a missing key waits, and the next request cancels the wait (no response)
      case 5:  // try_get
        if (it != data_.end()) {
          if (instance)
            out.push_back({proto::status::ok, id, std::nullopt, 32});
          else
            out.push_back({proto::status::ok, id, it->second});
        } else if (op == 5) {
          out.push_back({proto::status::not_found, id, bytes{}});
        }
        return;
      case 3: {  // add
        std::uint64_t current = 0;
        if (it != data_.end()) {
          if (it->second.size() != 8) {
            out.push_back({proto::status::refused, id, std::nullopt});
            return;
          }
          current = le(it->second.data(), 8);
        }
        const std::uint64_t next = current + le(value.data(), 8);
        bytes b(8);
        for (int i = 0; i < 8; ++i) b[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(next >> (8 * i));
        out.push_back(store(key, b) ? expected_response{proto::status::ok, id, b}
                                    : expected_response{proto::status::refused, id, std::nullopt});
        return;
      }
      case 4:  // del
        if (it != data_.end()) {
          total_ -= it->first.size() + it->second.size();
          data_.erase(it);
          if (key == proto::instance_key) instance_unknown_ = false;
        }
        out.push_back({proto::status::ok, id, bytes{}});
        return;
    }
  }

  bool store(const std::string& key, const bytes& value) {
    auto it = data_.find(key);
    const std::size_t old = it != data_.end() ? key.size() + it->second.size() : 0;
    if (it == data_.end() && data_.size() >= max_keys_) return false;
    if (total_ - old + key.size() + value.size() > max_total_) return false;
    total_ = total_ - old + key.size() + value.size();
    data_[key] = value;
    if (key == proto::instance_key) instance_unknown_ = false;
    if (key == watched_key && !first_watched_) first_watched_ = value;
    return true;
  }

  std::size_t max_total_, max_keys_;
  std::map<std::string, bytes> data_;
  std::size_t total_ = 0;
  bool instance_unknown_ = false;
  std::optional<bytes> first_watched_;
  bool closes_ = false;
};

// Reads responses as they come and checks them against the model's list.
class response_checker {
 public:
  explicit response_checker(std::vector<expected_response> want) : want_(std::move(want)) {}

  // Reads what the socket has; false once the server closed (or reset) the connection.
  bool read_some(int fd) {
    std::uint8_t buf[8192];
    for (;;) {
      const ssize_t k = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (k > 0) {
        have_.insert(have_.end(), buf, buf + k);
        parse();
        continue;
      }
      if (k == 0) return false;
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      reset_ = true;
      return false;
    }
  }

  // `cut`: the server closes this connection on a malformed request. It closes with
  // our unread bytes in its buffer, so the kernel resets the connection and may drop
  // responses still queued to us; what did arrive was checked one by one, in order.
  // A correct client never sees this, as it sends one request at a time.
  void at_end(bool cut) const {
    if (cut) return;
    require(!reset_, "the server reset a connection that sent nothing malformed");
    require(have_.empty(), "the connection ended inside a response");
    require(seen_ == want_.size(), "fewer responses than the requests the server must accept");
  }

 private:
  void parse() {
    for (;;) {
      if (have_.size() < proto::response_header_bytes) return;
      std::array<std::byte, proto::response_header_bytes> head;
      std::memcpy(head.data(), have_.data(), head.size());
      proto::response_header h;
      require(proto::decode(std::span<const std::byte, proto::response_header_bytes>(head), h),
              "the server sent a response its own decoder rejects");
      if (have_.size() - proto::response_header_bytes < h.value_len) return;
      require(seen_ < want_.size(), "a response to a request the server must not have answered");
      const expected_response& w = want_[seen_++];
      require(h.code == w.code, "response status differs from the model's");
      require(h.id == w.id, "response id differs from the request's");
      const std::uint8_t* v = have_.data() + proto::response_header_bytes;
      if (w.value)
        require(h.value_len == w.value->size() && std::equal(w.value->begin(), w.value->end(), v),
                "response value differs from the model's");
      if (w.any_value_of) require(h.value_len == w.any_value_of, "the instance id has the wrong length");
      if (h.code == proto::status::refused) require(h.value_len > 0, "a refusal without a reason");
      have_.erase(have_.begin(),
                  have_.begin() + static_cast<std::ptrdiff_t>(proto::response_header_bytes + h.value_len));
    }
  }

  std::vector<expected_response> want_;
  std::size_t seen_ = 0;
  bytes have_;
  bool reset_ = false;
};

const std::vector<std::byte>& token() {
  static const std::vector<std::byte> t(32, std::byte{0x5a});
  return t;
}

void wait_io(int fd, short events, plait::clock::time_point deadline) {
  pollfd p{fd, events, 0};
  const int timeout = plait::detail::poll_timeout_ms(deadline);
  require(timeout > 0, "the server neither read nor answered within 5 s");
  ::poll(&p, 1, timeout);
}

void run(const std::uint8_t* data, std::size_t size) {
  plait::fuzz::fuzz_input in(data, size);
  const std::uint8_t cfg = in.take_byte();
  in.take_schedule(4);
  const std::size_t header_bytes = size < 5 ? size : 5;

  plait::bootstrap::store_options options;
  if (cfg & 1u) {
    options.max_total_bytes = 256;
    options.max_keys = 4;
  }
  store_model model(options.max_total_bytes, options.max_keys);
  response_checker checker(model.run(data + header_bytes, size - header_bytes));

  plait::bootstrap::store_server server("127.0.0.1", 0, token(), options);
  const auto deadline = plait::clock::now() + std::chrono::seconds(5);
  auto connect = [&] {
    plait::detail::fd_handle fd = plait::detail::connect_tcp("127.0.0.1", server.port(), deadline);
    plait::bootstrap::authenticate(fd.get(), token(), plait::bootstrap::auth_role::client, proto::auth_context,
                                   deadline);
    return fd;
  };
  // The watcher's GET is in the server's socket before the streaming client even
  // connects, and the server reads it while that client authenticates.
  plait::detail::fd_handle watcher;
  if (cfg & 2u) {
    watcher = connect();
    const std::string_view key = store_model::watched_key;
    const auto head = proto::encode(proto::request_header{proto::op::get, 0x77, 1, 0});
    plait::detail::send_all(watcher.get(), head.data(), head.size(), deadline);
    plait::detail::send_all(watcher.get(), key.data(), key.size(), deadline);
  }
  plait::detail::fd_handle fd = connect();
  plait::detail::set_nonblocking(fd.get(), true);

  bool open = true, send_failed = false;
  while (open && in.stream_left()) {
    const auto chunk = in.next_chunk();
    std::size_t off = 0;
    while (open && off < chunk.size()) {
      const ssize_t k = ::send(fd.get(), chunk.data() + off, chunk.size() - off, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (k > 0) {
        off += static_cast<std::size_t>(k);
      } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        wait_io(fd.get(), POLLIN | POLLOUT, deadline);  // the server stops reading while it answers
      } else if (!(k < 0 && errno == EINTR)) {
        open = false;  // the server closed the connection
        send_failed = true;
      }
      open = checker.read_some(fd.get()) && open;
    }
  }
  ::shutdown(fd.get(), SHUT_WR);
  while (open) {
    wait_io(fd.get(), POLLIN, deadline);
    open = checker.read_some(fd.get());
  }
  checker.at_end(model.closes());
  require(model.closes() || !send_failed, "the server closed a connection that sent nothing malformed");

  if (watcher) {
    std::vector<expected_response> woken;
    if (model.first_watched()) woken.push_back({proto::status::ok, 0x77, model.first_watched()});
    response_checker watched(std::move(woken));
    plait::detail::set_nonblocking(watcher.get(), true);
    ::shutdown(watcher.get(), SHUT_WR);
    for (bool more = true; more;) {
      wait_io(watcher.get(), POLLIN, deadline);
      more = watched.read_some(watcher.get());
    }
    watched.at_end(false);
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
