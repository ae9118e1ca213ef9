// libFuzzer harness: the TCP transport's receive path (tcp_link + frame_reader) fed
// whatever a peer may send after the handshake and hello.
//
// Input: one configuration byte (depth 1..4, slot size 16/64/512/4096, how many data
// frames this side sends first so that the peer's credit frames can be valid, how the
// executor side releases slots), four chunk-size bytes, then the peer's byte stream.
// The stream goes into one end of a socketpair in those chunks; after each chunk the
// harness does what the progress and executor threads do: pump_rx(), peek()/release(),
// pump_tx() (credit frames). At the end it closes the peer's end and pumps to the end
// of the stream. Every outcome must be accepted slots identical to the frames in the
// stream, in order, or a recorded failure that health() throws as protocol/peer_lost.
#include <sys/socket.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <vector>

#include <plait/transport/detail/tcp_link.hpp>

#include "fuzz_input.hpp"

namespace {

using plait::fuzz::require;
using plait::transport::tcp_detail::control_frame;
using plait::transport::tcp_detail::control_magic;
using plait::transport::tcp_detail::link_state;
using plait::transport::tcp_detail::tcp_link;

struct data_frame {
  std::size_t offset;  // of the header in the stream
  std::size_t bytes;   // payload
};

// The data frames a correct receiver could accept, in order: frame boundaries follow
// from the bytes alone, whatever the chunking; parsing stops where the link must stop.
std::vector<data_frame> frames_in(const std::uint8_t* p, std::size_t n, std::size_t slot_bytes) {
  std::vector<data_frame> out;
  std::size_t pos = 0;
  while (n - pos >= sizeof(std::uint32_t)) {
    std::uint32_t magic;
    std::memcpy(&magic, p + pos, sizeof magic);
    if (magic == plait::detail::slot_magic) {
      plait::detail::slot_header h;
      if (n - pos < sizeof h) break;
      std::memcpy(&h, p + pos, sizeof h);
      if (h.version != plait::detail::wire_version || h.bytes > slot_bytes) break;
      if (n - pos - sizeof h < h.bytes) break;
      out.push_back({pos, h.bytes});
      pos += sizeof h + h.bytes;
    } else if (magic == control_magic) {
      if (n - pos < sizeof(control_frame)) break;
      pos += sizeof(control_frame);
    } else {
      break;
    }
  }
  return out;
}

class harness {
 public:
  harness(const std::uint8_t* stream, std::size_t stream_bytes, std::size_t slot_bytes, unsigned release_policy)
      : stream_(stream),
        expected_(frames_in(stream, stream_bytes, slot_bytes)),
        slot_bytes_(slot_bytes),
        policy_(release_policy) {}

  // One turn of the progress thread and then of the executor.
  void step(tcp_link& link, int peer) {
    link.pump_rx();
    switch (policy_) {
      case 0:  // the executor keeps up
      case 3:
        while (consume(link)) {
        }
        break;
      case 1:  // the executor is busy elsewhere
        check_front(link);
        break;
      case 2:  // one slot per turn
        consume(link);
        break;
    }
    if (policy_ == 3 || policy_ == 0) {  // credits for released slots
      link.pump_tx();
      drain(peer);
    }
  }

  // Releases every slot still held (the executor after the collective's end).
  void finish(tcp_link& link) {
    while (consume(link)) {
    }
    require(delivered_ <= expected_.size(), "more slots accepted than whole data frames sent");
  }

  static void drain(int peer) {
    std::uint8_t sink[4096];
    while (::recv(peer, sink, sizeof sink, MSG_DONTWAIT) > 0) {
    }
  }

 private:
  // The slot at the front of the receive FIFO equals the next data frame of the stream.
  bool check_front(tcp_link& link) {
    const plait::slot_view v = link.peek();
    if (v.header == nullptr) return false;
    require(delivered_ < expected_.size(), "a slot that is not a whole data frame of the stream");
    const data_frame& f = expected_[delivered_];
    require(v.header->bytes == f.bytes && v.header->bytes <= slot_bytes_, "slot length differs from the frame's");
    require(std::memcmp(v.header, stream_ + f.offset, sizeof(plait::detail::slot_header)) == 0,
            "slot header differs from the frame's");
    require(std::memcmp(v.payload, stream_ + f.offset + sizeof(plait::detail::slot_header), f.bytes) == 0,
            "slot payload differs from the frame's");
    return true;
  }

  bool consume(tcp_link& link) {
    if (!check_front(link)) return false;
    link.release();
    ++delivered_;
    return true;
  }

  const std::uint8_t* stream_;
  std::vector<data_frame> expected_;
  std::size_t slot_bytes_;
  unsigned policy_;
  std::size_t delivered_ = 0;
};

bool failed(const tcp_link& link) { return link.state() == link_state::broken || link.state() == link_state::lost; }

void run(const std::uint8_t* data, std::size_t size) {
  plait::fuzz::fuzz_input in(data, size);
  const std::uint8_t cfg = in.take_byte();
  static constexpr std::size_t slot_sizes[] = {16, 64, 512, 4096};
  const std::size_t depth = 1 + (cfg & 3u);
  const std::size_t slot_bytes = slot_sizes[(cfg >> 2) & 3u];
  const std::size_t sends = std::min<std::size_t>((cfg >> 4) & 3u, depth);
  const unsigned policy = cfg >> 6;
  in.take_schedule(4);
  const std::size_t header_bytes = size < 5 ? size : 5;

  int sv[2];
  require(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair failed");
  plait::detail::fd_handle peer(sv[1]);
  plait::detail::set_nonblocking(peer.get(), true);
  tcp_link link(0, 1, plait::detail::fd_handle(sv[0]), slot_bytes, depth);
  harness h(data + header_bytes, size - header_bytes, slot_bytes, policy);

  // Frames this rank sent before the peer's bytes: they make credits up to `sends` valid.
  for (std::size_t i = 0; i < sends; ++i) {
    require(link.acquire() != nullptr, "no send slot on a fresh link");
    plait::detail::slot_header s;
    s.bytes = static_cast<std::uint32_t>(i);
    s.sender = 0;
    link.post(s);
  }
  link.pump_tx();
  harness::drain(peer.get());

  bool peer_gone = false;
  while (in.stream_left() && !failed(link) && !peer_gone) {
    const auto chunk = in.next_chunk();
    std::size_t off = 0;
    int stalls = 0;
    while (off < chunk.size()) {
      const ssize_t k = ::send(peer.get(), chunk.data() + off, chunk.size() - off, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (k > 0) {
        off += static_cast<std::size_t>(k);
      } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && ++stalls < 8) {
      } else if (k < 0 && errno == EINTR) {
      } else {
        peer_gone = true;  // the link shut its socket down (garbage) or stopped reading
        break;
      }
      h.step(link, peer.get());
    }
  }

  // End of stream, then the progress thread's last turns.
  ::shutdown(peer.get(), SHUT_WR);
  for (int i = 0; i < 4; ++i) h.step(link, peer.get());
  require(link.state() != link_state::ok, "the stream ended but the link still reads as healthy");
  h.finish(link);

  // Every slot is released and the stream has ended: whatever the peer sent, this
  // rank can no longer wait on it, so health() must say why.
  bool threw = false;
  try {
    link.health();
  } catch (const plait::error& e) {
    threw = true;
    // timeout: the peer's closing frame said it gave up waiting (a forwarded timeout).
    require(e.code() == plait::errc::protocol || e.code() == plait::errc::peer_lost || e.code() == plait::errc::timeout,
            "health() threw a code other than protocol, peer_lost or timeout");
    if (link.state() == link_state::broken)
      require(e.code() == plait::errc::protocol, "garbage recorded but health() did not say protocol");
  }
  require(threw, "health() passed after the end of the stream");
  link.shut_down();
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
