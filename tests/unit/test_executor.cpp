// The executor's checks on received slots, scripted: a fake link_set hands it slot
// headers as a broken or hostile peer might write them, and each must end the call
// with the right error (protocol for framing and sequence, mismatch for a different
// call), naming the peer, before any payload is copied out.
#include <plait/detail/comm_core.hpp>
#include <plait/executor.hpp>

#include <cstring>
#include <deque>
#include <functional>

#include <catch2/catch.hpp>

using namespace plait::detail;

namespace {

constexpr std::size_t slot_size = 256;

// Peer 1's slots to rank 0, as scripted; sends are swallowed.
class scripted_links final : public plait::link_set {
 public:
  struct slot {
    slot_header header;
    std::vector<std::byte> payload;
  };
  std::deque<slot> inbox;
  std::vector<std::byte> outbox = std::vector<std::byte>(slot_size);

  bool reaches(int peer) const override { return peer == 1; }
  std::size_t slot_bytes() const override { return slot_size; }
  std::byte* acquire(int) override { return outbox.data(); }
  void post(int, const slot_header&) override {}
  plait::slot_view peek(int) override {
    if (inbox.empty()) return {};
    return {&inbox.front().header, inbox.front().payload.data()};
  }
  void release(int) override { inbox.pop_front(); }
  void health(int) override {}
  void close(plait::close_reason) noexcept override {}
};

void copy_kernel(const void*, const void* const* srcs, int, void* const* dsts, int ndst, std::size_t count,
                 int) noexcept {
  for (int d = 0; d < ndst; ++d) std::memcpy(dsts[d], srcs[0], count * sizeof(float));
}

call_desc desc_for(std::uint64_t sequence, std::size_t count) {
  call_desc d;
  d.sequence = sequence;
  d.count = count;
  d.slice_bytes = slot_size;
  d.kind = collective_kind::broadcast;
  d.root = 1;
  d.algorithm = 1;
  return d;
}

// Rank 0 of 2 receives `count` floats from rank 1 in one step.
struct receiver {
  scripted_links links;
  doorbell bell;
  std::atomic<bool> aborted{false};
  std::vector<std::uint64_t> last_seen = std::vector<std::uint64_t>(4, 0);
  std::vector<float> out = std::vector<float>(64, -1.0f);

  std::unique_ptr<call> make_call(std::uint64_t sequence, std::size_t count) {
    auto c = std::make_unique<call>();
    c->desc = desc_for(sequence, count);
    c->steps = {recv(1, 0, count)};
    c->elem_size = sizeof(float);
    c->output = reinterpret_cast<std::byte*>(out.data());
    c->kernel = copy_kernel;
    c->deadline = plait::clock::now() + std::chrono::seconds(5);
    c->count_peers(2);
    return c;
  }
  // What peer 1 would send for call `sequence` of `count` floats, all 7.0f.
  scripted_links::slot good_slot(std::uint64_t sequence, std::size_t count) {
    scripted_links::slot s;
    s.header.sender = 1;
    s.header.bytes = static_cast<std::uint32_t>(count * sizeof(float));
    s.header.desc = desc_for(sequence, count);
    s.payload.resize(slot_size);
    const float seven = 7.0f;
    for (std::size_t i = 0; i < count; ++i) std::memcpy(s.payload.data() + i * sizeof(float), &seven, sizeof seven);
    return s;
  }
  // Runs call `sequence`; returns the error it ended with, if any.
  std::optional<plait::error> run(std::uint64_t sequence, std::size_t count) {
    executor ex(0, 2, &links, bell, aborted, last_seen);
    auto c = make_call(sequence, count);
    try {
      if (!ex.advance(*c)) return plait::error(plait::errc::timeout, "the step did not run", 0);
    } catch (const plait::error& e) {
      return e;
    }
    return std::nullopt;
  }
};

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("executor: a well-formed slot is copied out and consumed", "[unit][executor]") {
  receiver r;
  r.links.inbox.push_back(r.good_slot(1, 16));
  REQUIRE_FALSE(r.run(1, 16).has_value());
  CHECK(r.out[0] == 7.0f);
  CHECK(r.out[15] == 7.0f);
  CHECK(r.out[16] == -1.0f);
  CHECK(r.links.inbox.empty());
}

TEST_CASE("executor: malformed or replayed slots are protocol errors naming the peer, nothing copied",
          "[unit][executor]") {
  struct bad_case {
    const char* name;
    std::function<void(scripted_links::slot&)> change;
    plait::errc code;
    const char* says;
  };
  const std::vector<bad_case> cases = {
      {"bad magic", [](auto& s) { s.header.magic = 0xabababab; }, plait::errc::protocol, "malformed slot header"},
      {"unknown version", [](auto& s) { s.header.version = 9; }, plait::errc::protocol, "malformed slot header"},
      {"sender is not the peer", [](auto& s) { s.header.sender = 5; }, plait::errc::protocol, "malformed slot header"},
      {"length larger than the step", [](auto& s) { s.header.bytes = 17 * sizeof(float); }, plait::errc::protocol,
       "holds 68 bytes"},
      {"length larger than a slot", [](auto& s) { s.header.bytes = 0xffffffffu; }, plait::errc::protocol,
       "holds 4294967295 bytes"},
      {"short slot", [](auto& s) { s.header.bytes = 4; }, plait::errc::protocol, "holds 4 bytes"},
      {"other collective", [](auto& s) { s.header.desc.kind = collective_kind::all_reduce; }, plait::errc::mismatch,
       "called all_reduce"},
      {"other count", [](auto& s) { s.header.desc.count = 17; }, plait::errc::mismatch, "count"},
      {"later sequence (a call skipped)", [](auto& s) { s.header.desc.sequence = 6; }, plait::errc::mismatch,
       "sequence"},
      {"sequence gone back (replayed slot)", [](auto& s) { s.header.desc.sequence = 3; }, plait::errc::protocol,
       "never go back"},
  };
  for (const auto& bc : cases) {
    SECTION(bc.name) {
      receiver r;
      // Calls 4 went through; call 5 then gets the scripted slot.
      r.links.inbox.push_back(r.good_slot(4, 16));
      REQUIRE_FALSE(r.run(4, 16).has_value());
      std::fill(r.out.begin(), r.out.end(), -1.0f);
      auto s = r.good_slot(5, 16);
      bc.change(s);
      r.links.inbox.push_back(s);
      const auto e = r.run(5, 16);
      REQUIRE(e.has_value());
      INFO(e->what());
      CHECK(e->code() == bc.code);
      CHECK(e->peer() == 1);
      CHECK(e->rank() == 0);
      CHECK(contains(e->what(), bc.says));
      CHECK(r.out[0] == -1.0f);  // no payload copied out
      CHECK(r.links.inbox.size() == 1);
    }
  }
}

TEST_CASE("executor: send/recv sequences are checked apart from collectives", "[unit][executor]") {
  receiver r;
  r.links.inbox.push_back(r.good_slot(9, 4));
  REQUIRE_FALSE(r.run(9, 4).has_value());
  // A send/recv numbered 1 after collective 9 is in order: the counters are separate.
  auto s = r.good_slot(1, 4);
  s.header.desc.kind = collective_kind::point_to_point;
  r.links.inbox.push_back(s);
  executor ex(0, 2, &r.links, r.bell, r.aborted, r.last_seen);
  auto c = r.make_call(1, 4);
  c->desc.kind = collective_kind::point_to_point;
  CHECK(ex.advance(*c));
  // Another send/recv numbered 0 after it went back.
  auto again = r.good_slot(0, 4);
  again.header.desc.kind = collective_kind::point_to_point;
  r.links.inbox.push_back(again);
  auto c2 = r.make_call(0, 4);
  c2->desc.kind = collective_kind::point_to_point;
  CHECK_THROWS_WITH(ex.advance(*c2), Catch::Contains("never go back"));
}

TEST_CASE("a call makes room for all its sends to be pending at once", "[unit][executor]") {
  call c;
  for (int i = 0; i < 5; ++i) {
    step s;
    s.send_peer[0] = 1;
    if (i % 2 == 0) s.send_peer[1] = 2;
    s.recv_peer[0] = 3;
    c.steps.push_back(s);
  }
  c.count_peers(4);
  CHECK(c.sends_left == std::vector<std::uint32_t>{0, 5, 3, 0});
  CHECK(c.pending.capacity() >= 8);
  const std::size_t room = c.pending.capacity();
  c.reset();
  CHECK(c.pending.capacity() == room);  // a reused call keeps it
}

namespace {

// A link set that receives into the caller's memory (as tcp does): it records what
// the executor expects, says `later` from its window of 2 frames on, and shows a
// frame as landed (its payload at the address expected) once `landed` is set.
class landing_links final : public plait::link_set {
 public:
  struct asked {
    std::size_t ahead;
    std::uint32_t bytes;
    int sender;
    std::byte* dst;
  };
  std::vector<asked> expected;
  std::vector<std::byte> outbox = std::vector<std::byte>(1 << 16);
  slot_header head;
  const std::byte* landed = nullptr;

  bool reaches(int peer) const override { return peer == 1; }
  std::size_t slot_bytes() const override { return outbox.size(); }
  std::byte* acquire(int) override { return outbox.data(); }
  void post(int, const slot_header&) override {}
  bool sends_from_memory(int) const override { return true; }
  std::uint64_t post_from(int, const slot_header&, const std::byte*) override { return 0; }
  bool receives_into_memory(int) const override { return true; }
  expectation expect(int, std::size_t ahead, const slot_header& h, std::byte* dst) override {
    expected.push_back({ahead, h.bytes, h.sender, dst});
    return ahead >= 2 ? expectation::later : expectation::posted;
  }
  plait::slot_view peek(int) override {
    if (landed == nullptr) return {};
    return {&head, landed};
  }
  void release(int) override { landed = nullptr; }
  void health(int) override {}
  void close(plait::close_reason) noexcept override {}
};

int kernel_runs = 0;
void counting_kernel(const void* op, const void* const* srcs, int nsrc, void* const* dsts, int ndst, std::size_t count,
                     int finalize_n) noexcept {
  ++kernel_runs;
  copy_kernel(op, srcs, nsrc, dsts, ndst, count, finalize_n);
}

}  // namespace

TEST_CASE("executor: frames a step only copies into the output are expected there, never over a region in use",
          "[unit][executor]") {
  constexpr std::size_t slice = 4096;  // floats: 16 KiB, the smallest slice that may land
  landing_links links;
  doorbell bell;
  std::atomic<bool> aborted{false};
  std::vector<std::uint64_t> last_seen(4, 0);
  std::vector<float> in(4 * slice, 1.0f), out(4 * slice, -1.0f);
  const bool in_place = GENERATE(false, true);
  CAPTURE(in_place);
  call c;
  c.desc = desc_for(1, 4 * slice);
  c.desc.kind = collective_kind::all_gather;
  c.desc.slice_bytes = slice * sizeof(float);
  c.steps = {send(1, region::input, 0, slice),  // reads input[0, slice)
             recv(1, 0, slice),                 // output[0, slice): the region just sent from, if in place
             recv(1, slice, slice),
             recv(1, 2 * slice, 100),     // too small to land
             recv(1, 0, slice),           // written by the second step: not before it ran
             recv(1, 3 * slice, slice)};  // the fifth frame still to come: beyond the window
  c.elem_size = sizeof(float);
  c.input = reinterpret_cast<const std::byte*>(in_place ? out.data() : in.data());
  c.output = reinterpret_cast<std::byte*>(out.data());
  c.kernel = counting_kernel;
  c.deadline = plait::clock::now() + std::chrono::seconds(5);
  c.count_peers(2);
  executor ex(0, 2, &links, bell, aborted, last_seen);
  REQUIRE_FALSE(ex.advance(c));  // the send ran; the first receive waits
  CHECK(c.next == 1);
  auto at = [&](std::size_t elem) { return c.output + elem * sizeof(float); };
  // Each step is looked at once; the one told `later` is asked again at every advance.
  std::vector<std::byte*> posted, later;
  for (const auto& a : links.expected) {
    CHECK(a.bytes == slice * sizeof(float));
    CHECK(a.sender == 1);
    if (a.ahead < 2) {
      posted.push_back(a.dst);
    } else {
      CHECK(a.ahead == 4);  // four receives from rank 1 come before it
      later.push_back(a.dst);
    }
  }
  if (in_place)  // the first receive's region is what the send read: not expected
    CHECK(posted == std::vector<std::byte*>{at(slice)});
  else
    CHECK(posted == std::vector<std::byte*>{at(0), at(slice)});
  REQUIRE_FALSE(later.empty());
  for (std::byte* d : later) CHECK(d == at(3 * slice));
  const std::size_t asked = links.expected.size();
  REQUIRE_FALSE(ex.advance(c));
  REQUIRE(links.expected.size() == asked + 1);
  CHECK(links.expected.back().dst == at(3 * slice));

  // A frame that landed in the output is taken as it is: no copy.
  links.head.sender = 1;
  links.head.bytes = slice * sizeof(float);
  links.head.desc = c.desc;
  kernel_runs = 0;
  if (!in_place) {
    links.landed = at(0);
    REQUIRE_FALSE(ex.advance(c));
    CHECK(c.next == 2);
    CHECK(kernel_runs == 0);
    CHECK(out[0] == -1.0f);  // the test's link wrote nothing there; the executor did not either
  }
}

namespace {

// A link set that sends from the caller's memory and records, for each post_from,
// where the bytes were and what the output held at that moment.
class send_order_links final : public plait::link_set {
 public:
  std::vector<std::byte> outbox = std::vector<std::byte>(1 << 16);
  const std::vector<float>* output = nullptr;
  std::vector<const std::byte*> sent_from;
  std::vector<float> output_when_sent;
  int slot_posts = 0;

  bool reaches(int peer) const override { return peer == 1; }
  std::size_t slot_bytes() const override { return outbox.size(); }
  std::byte* acquire(int) override { return outbox.data(); }
  void post(int, const slot_header&) override { ++slot_posts; }
  bool sends_from_memory(int) const override { return true; }
  std::uint64_t post_from(int, const slot_header&, const std::byte* from) override {
    sent_from.push_back(from);
    output_when_sent.push_back(output->front());
    return 0;
  }
  plait::slot_view peek(int) override { return {}; }
  void release(int) override {}
  void health(int) override {}
  void close(plait::close_reason) noexcept override {}
};

}  // namespace

TEST_CASE("executor: a step that copies its local source and sends it sends from that source, before the copy",
          "[unit][executor]") {
  constexpr std::size_t count = 8192;  // floats: 32 KiB, above the 16 KiB a send from memory takes
  send_order_links links;
  doorbell bell;
  std::atomic<bool> aborted{false};
  std::vector<std::uint64_t> last_seen(4, 0);
  std::vector<float> in(count, 2.0f), out(2 * count, -1.0f);
  links.output = &out;
  call c;
  c.desc = desc_for(1, count);
  c.desc.kind = collective_kind::all_gather;
  c.desc.slice_bytes = count * sizeof(float);
  step first = copy(region::input, 0, 0, count);  // all_gather's own block...
  first.send_peer[0] = 1;                         // ...also sent to the next rank
  c.steps = {first};
  c.elem_size = sizeof(float);
  c.input = reinterpret_cast<const std::byte*>(in.data());
  c.output = reinterpret_cast<std::byte*>(out.data());
  c.kernel = copy_kernel;
  c.deadline = plait::clock::now() + std::chrono::seconds(5);
  c.count_peers(2);
  executor ex(0, 2, &links, bell, aborted, last_seen);
  ex.advance(c);
  CHECK(c.next == 1);
  CHECK(links.slot_posts == 0);
  REQUIRE(links.sent_from.size() == 1);
  CHECK(links.sent_from[0] == c.input);       // from the input: the same bytes as the copy
  CHECK(links.output_when_sent[0] == -1.0f);  // posted before the kernel wrote the output
  CHECK(out[0] == 2.0f);                      // and the copy ran
  CHECK(out[count - 1] == 2.0f);
}

TEST_CASE("executor: an in-place reduction that sends its output sends it after the kernel wrote it",
          "[unit][executor]") {
  // recv_reduce_copy_send in place: the local source and the output are one address,
  // so a send from the output must not go first.
  constexpr std::size_t count = 8192;
  send_order_links links;
  struct one_slot final : plait::link_set {
    send_order_links& sends;
    slot_header header;
    std::vector<std::byte> payload = std::vector<std::byte>(count * sizeof(float));
    bool taken = false;
    explicit one_slot(send_order_links& s) : sends(s) {}
    bool reaches(int peer) const override { return peer == 1; }
    std::size_t slot_bytes() const override { return payload.size(); }
    std::byte* acquire(int p) override { return sends.acquire(p); }
    void post(int p, const slot_header& h) override { sends.post(p, h); }
    bool sends_from_memory(int) const override { return true; }
    std::uint64_t post_from(int p, const slot_header& h, const std::byte* f) override {
      return sends.post_from(p, h, f);
    }
    plait::slot_view peek(int) override {
      if (taken) return {};
      return {&header, payload.data()};
    }
    void release(int) override { taken = true; }
    void health(int) override {}
    void close(plait::close_reason) noexcept override {}
  } link(links);
  std::vector<float> buf(count, 1.0f);  // input and output: in place
  links.output = &buf;
  const float three = 3.0f;
  for (std::size_t i = 0; i < count; ++i) std::memcpy(link.payload.data() + i * sizeof(float), &three, sizeof three);
  call c;
  c.desc = desc_for(1, count);
  c.desc.kind = collective_kind::all_reduce;
  c.desc.slice_bytes = count * sizeof(float);
  link.header.sender = 1;
  link.header.bytes = static_cast<std::uint32_t>(count * sizeof(float));
  link.header.desc = c.desc;
  c.steps = {recv_reduce_copy_send(1, 0, 0, 1, count)};
  c.elem_size = sizeof(float);
  c.input = reinterpret_cast<const std::byte*>(buf.data());
  c.output = reinterpret_cast<std::byte*>(buf.data());
  c.kernel = [](const void*, const void* const* srcs, int nsrc, void* const* dsts, int ndst, std::size_t n,
                int) noexcept {
    for (int d = 0; d < ndst; ++d)
      for (std::size_t i = 0; i < n; ++i) {
        float v = 0;
        for (int k = 0; k < nsrc; ++k) v += static_cast<const float*>(srcs[k])[i];
        static_cast<float*>(dsts[d])[i] = v;
      }
  };
  doorbell bell;
  std::atomic<bool> aborted{false};
  std::vector<std::uint64_t> last_seen(4, 0);
  c.count_peers(2);
  executor ex(0, 2, &link, bell, aborted, last_seen);
  ex.advance(c);
  CHECK(c.next == 1);
  REQUIRE(links.sent_from.size() == 1);
  CHECK(links.sent_from[0] == c.output);
  CHECK(links.output_when_sent[0] == 4.0f);  // the sum, not the input it overwrote
  CHECK(buf[count - 1] == 4.0f);
}

TEST_CASE("fifo_list: first in, first out, reusing its memory", "[unit][executor]") {
  fifo_list<std::shared_ptr<int>> q;
  CHECK(q.empty());
  // One in flight at a time, as blocking calls go: never more than one element's room.
  for (int i = 0; i < 100; ++i) {
    q.push_back(std::make_shared<int>(i));
    REQUIRE(*q.front() == i);
    q.pop_front();
    REQUIRE(q.empty());
  }
  // Several in flight, popped from the front while more are pushed: order holds across
  // the compaction that reuses the room the front left.
  std::vector<int> seen;
  int next = 0;
  for (int round = 0; round < 20; ++round) {
    for (int k = 0; k < 3; ++k) q.push_back(std::make_shared<int>(next++));
    for (int k = 0; k < 2; ++k) {
      seen.push_back(*q.front());
      q.pop_front();
    }
  }
  std::vector<int> rest;
  for (auto& p : q) rest.push_back(*p);
  CHECK(rest.size() == 20);
  while (!q.empty()) {
    seen.push_back(*q.front());
    q.pop_front();
  }
  REQUIRE(seen.size() == 60);
  for (int i = 0; i < 60; ++i) CHECK(seen[static_cast<std::size_t>(i)] == i);
  // A popped element is released at once, not when the list is next compacted.
  auto held = std::make_shared<int>(7);
  q.push_back(held);
  q.push_back(std::make_shared<int>(8));
  q.pop_front();
  CHECK(held.use_count() == 1);
  q.clear();
  CHECK(q.empty());
}
