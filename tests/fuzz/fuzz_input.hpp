// Helpers shared by the libFuzzer harnesses in this directory (tools/fuzz.sh builds them).
//
// fuzz_input splits one fuzzer input into a few leading parameter bytes and the
// stream under test, and hands the stream out in chunks whose sizes the parameter
// bytes choose, so the fuzzer explores both the content and every way a peer's bytes
// can be split across reads. At most max_chunks chunks are cut; the rest of the stream
// is the last one, which bounds the system calls an input costs (a harness over a
// socket stays well under 10 ms per input). require() turns a broken invariant into an abort, which
// libFuzzer reports as a crash with the input that caused it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

namespace plait::fuzz {

inline void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what);
  std::abort();
}

class fuzz_input {
 public:
  fuzz_input(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}

  // The next parameter byte, 0 once the input is used up.
  std::uint8_t take_byte() { return pos_ < size_ ? data_[pos_++] : 0; }

  // Takes `n` bytes of chunk-size schedule; the rest of the input is the stream.
  void take_schedule(std::size_t n) {
    for (std::size_t i = 0; i < n && i < sizeof schedule_; ++i) schedule_[i] = take_byte();
    schedule_len_ = n < sizeof schedule_ ? n : sizeof schedule_;
  }

  bool stream_left() const { return pos_ < size_; }

  static constexpr std::size_t max_chunks = 48;

  // The next chunk of the stream: 1..240 bytes for small schedule values (byte-by-byte
  // splits), multiples of 4 KiB for the largest ones.
  std::span<const std::uint8_t> next_chunk() {
    std::size_t want = 1;
    if (schedule_len_ > 0 && turn_ < max_chunks - 1) {
      const unsigned s = schedule_[turn_++ % schedule_len_];
      want = s < 0xf0 ? s + 1 : (s - 0xef) * std::size_t{4096};
    } else {
      want = size_;  // no schedule, or the last chunk
    }
    const std::size_t left = size_ - pos_;
    const std::size_t n = want < left ? want : left;
    std::span<const std::uint8_t> chunk(data_ + pos_, n);
    pos_ += n;
    return chunk;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
  std::uint8_t schedule_[8] = {};
  std::size_t schedule_len_ = 0;
  std::size_t turn_ = 0;
};

}  // namespace plait::fuzz
