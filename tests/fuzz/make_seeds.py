# Writes the hand-made seed inputs of each fuzz target (tests/fuzz/*.cpp) to
# <out>/<target>/<sha1 of the content>, the naming libFuzzer uses, so that
#   python3 tests/fuzz/make_seeds.py tests/fuzz/corpus
# adds them to the kept corpus without duplicates. Each harness's input layout
# (configuration bytes, chunk-size bytes, stream) is described at its top.
# Rerun it when a wire format changes; tools/fuzz.sh --merge adds what fuzzing finds.
import hashlib, os, struct, sys

out = sys.argv[1]

def put(target, blob):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, hashlib.sha1(blob).hexdigest()), 'wb') as f:
        f.write(blob)

# ---- tcp_frames: cfg | 4 schedule bytes | stream ----
SLOT = 0x504c5431; CTL = 0x504c4331
def slot(nbytes, seq=1, version=1, flags=0, payload=None):
    h = struct.pack('<IHHIiQQ', SLOT, version, flags, nbytes, 1, 0, 0)
    desc = struct.pack('<QQIiBBBBI', seq, nbytes // 4, 4096, -1, 1, 7, 1, 1, 0)
    p = payload if payload is not None else bytes((i * 7 + seq) & 0xff for i in range(nbytes))
    return h + desc + p
def ctl(kind, value, version=1, magic=CTL):
    return struct.pack('<IHHQ', magic, version, kind, value)
def cfg(depth, slot_idx, sends, policy):
    return bytes([(depth - 1) | (slot_idx << 2) | (sends << 4) | (policy << 6)])
big = [0xef] * 4          # 240-byte chunks
one = [0x00] * 4          # byte by byte
mixed = [0x02, 0x3f, 0x00, 0xf0]
s64 = 1  # slot size index: 64 bytes
normal = slot(10, 1) + ctl(1, 1) + slot(0, 2) + slot(64, 3) + ctl(2, 1) + slot(5, 4)
put('tcp_frames', cfg(4, s64, 2, 0) + bytes(big) + normal)
put('tcp_frames', cfg(4, s64, 2, 3) + bytes(one) + normal)
put('tcp_frames', cfg(2, s64, 1, 2) + bytes(mixed) + slot(64, 1) + slot(64, 2) + ctl(1, 1) + slot(1, 3))
put('tcp_frames', cfg(1, 3, 0, 0) + bytes([0xf0, 0x10, 0xff, 0x00]) + slot(4096, 1) + slot(4000, 2) + ctl(2, 0))
put('tcp_frames', cfg(4, 0, 0, 0) + bytes(big) + slot(16, 1, flags=1) + ctl(2, 0))  # error notice, then close
PEER_LOST = 3
put('tcp_frames', cfg(4, s64, 0, 0) + bytes(big) + ctl(2, 1 | (PEER_LOST << 32) | (6 << 40)) + slot(8))  # closing: lost rank 5
put('tcp_frames', cfg(4, s64, 0, 0) + bytes(big) + ctl(2, 0 | (PEER_LOST << 32) | (1 << 40)))  # blames this rank itself
put('tcp_frames', cfg(4, s64, 0, 0) + bytes(big) + ctl(2, 0xffffffffffffffff))
# edge cases: each ends in a protocol error or a loss
put('tcp_frames', cfg(4, s64, 0, 0) + bytes(big) + b'GARBAGE!' * 8)
put('tcp_frames', cfg(4, s64, 0, 0) + bytes(big) + slot(65))                      # longer than the slot
put('tcp_frames', cfg(4, s64, 0, 0) + bytes(big) + slot(8, version=2))             # wrong slot version
put('tcp_frames', cfg(4, s64, 1, 0) + bytes(big) + ctl(1, 2))                      # credit beyond what was spent
put('tcp_frames', cfg(4, s64, 0, 0) + bytes(big) + ctl(1, 0))                      # zero credit
put('tcp_frames', cfg(4, s64, 0, 0) + bytes(big) + ctl(2, 1) + ctl(2, 0))          # second closing frame
put('tcp_frames', cfg(2, s64, 0, 0) + bytes(big) + ctl(2, 3))                      # closing announces > depth
put('tcp_frames', cfg(4, s64, 0, 0) + bytes(big) + ctl(2, 0) + slot(4))            # slot after closing 0
put('tcp_frames', cfg(4, s64, 0, 0) + bytes(big) + ctl(2, 2) + slot(4))            # announced slot missing
put('tcp_frames', cfg(4, s64, 0, 0) + bytes(big) + ctl(7, 1))                      # unknown control type
put('tcp_frames', cfg(4, s64, 0, 0) + bytes(big) + ctl(1, 1, version=9))           # control version
put('tcp_frames', cfg(1, s64, 0, 1) + bytes(big) + slot(4, 1) + slot(4, 2))        # more slots than credits
put('tcp_frames', cfg(4, s64, 0, 0) + bytes(big) + slot(40)[:70])                  # ends inside a payload
put('tcp_frames', cfg(4, s64, 0, 0) + bytes(big) + slot(40)[:30])                  # ends inside a header
put('tcp_frames', cfg(4, s64, 0, 0) + bytes(big))                                  # nothing at all

# ---- store_requests: cfg | 4 schedule bytes | stream ----
def req(op, key, value=b'', rid=1, magic=b'pltS', version=1, reserved=0, key_len=None, value_len=None):
    kl = len(key) if key_len is None else key_len
    vl = len(value) if value_len is None else value_len
    return magic + bytes([version, op]) + struct.pack('<HIIQ', reserved, rid, kl, vl) + key + value
SET, GET, ADD, DEL, TRY = 1, 2, 3, 4, 5
st_normal = (req(SET, b'a/0', b'hello', 1) + req(GET, b'a/0', rid=2) + req(TRY, b'nope', rid=3) +
             req(ADD, b'ctr', struct.pack('<q', 5), 4) + req(ADD, b'ctr', struct.pack('<q', -7), 5) +
             req(DEL, b'a/0', rid=6) + req(TRY, b'a/0', rid=7) + req(TRY, b'plait/instance', rid=8))
put('store_requests', bytes([0] + big) + st_normal)
put('store_requests', bytes([0] + one) + st_normal)
put('store_requests', bytes([1] + mixed) + req(SET, b'k1', b'x' * 100, 1) + req(SET, b'k2', b'y' * 100, 2) +
    req(SET, b'k3', b'z', 3) + req(SET, b'k4', b'w', 4) + req(ADD, b'k1', bytes(8), 5))   # key cap
put('store_requests', bytes([1] + big) + req(SET, b'k1', b'x' * 150, 1) + req(SET, b'k2', b'y' * 100, 2) +
    req(SET, b'k1', b'x' * 10, 3) + req(SET, b'k2', b'y' * 100, 4))                      # byte cap
put('store_requests', bytes([2] + big) + req(SET, b'w', b'first', 1) + req(SET, b'w', b'second', 2))  # wakes a waiter
put('store_requests', bytes([3] + big) + req(SET, b'w', b'v' * 300, 1) + req(ADD, b'w', struct.pack('<q', 1), 2)) # refused, then add wakes
put('store_requests', bytes([0] + big) + req(GET, b'later', rid=1) + req(SET, b'later', b'v', 2) +
    req(GET, b'later', rid=3))                                                        # a waiting GET cancelled
put('store_requests', bytes([0, 0xf0, 0xf0, 0x80, 0x00]) + req(SET, b'big', bytes(range(256)) * 24, 1) +
    req(GET, b'big', rid=2))
put('store_requests', bytes([0] + big) + req(SET, b'plait/instance', b'mine', 1) + req(ADD, b'plait/instance', bytes(8), 2))
# edge cases: each closes the connection
put('store_requests', bytes([0] + big) + req(SET, b'k', b'v', magic=b'pltX'))
put('store_requests', bytes([0] + big) + req(SET, b'k', b'v', version=2))
put('store_requests', bytes([0] + big) + req(SET, b'k', b'v', reserved=1))
put('store_requests', bytes([0] + big) + req(9, b'k'))
put('store_requests', bytes([0] + big) + req(SET, b''))
put('store_requests', bytes([0] + big) + req(SET, b'k' * 513))
put('store_requests', bytes([0] + big) + req(SET, b'k', key_len=1, value_len=(16 << 20) + 1))
put('store_requests', bytes([0] + big) + req(SET, b'k', key_len=1, value_len=(16 << 20)))   # huge, then EOF
put('store_requests', bytes([0] + big) + req(ADD, b'k', bytes(7)))
put('store_requests', bytes([0] + big) + req(GET, b'k', b'v'))
put('store_requests', bytes([0] + big) + req(SET, b'k', b'v')[:20])

# ---- auth_handshake: cfg | 2 schedule bytes | peer bytes (proof bytes XOR the correct proof) ----
def hello(role, magic=b'pltA', version=1, pad=0):
    return magic + struct.pack('<HBB', version, role, pad) + bytes(range(32))
CLIENT, SERVER = 0, 1
for ctx in (0, 2):
    put('auth_handshake', bytes([1 | ctx, 0xef, 0xef]) + hello(CLIENT) + bytes(32))          # server side, success
    put('auth_handshake', bytes([0 | ctx, 0xef, 0xef]) + hello(SERVER) + bytes(33))          # client side, success
put('auth_handshake', bytes([1, 0, 0]) + hello(CLIENT) + bytes(32) + b'trailing')           # byte by byte, extra bytes
put('auth_handshake', bytes([0, 3, 40]) + hello(SERVER) + bytes(33))
put('auth_handshake', bytes([1, 0xef, 0xef]) + hello(CLIENT) + b'\x01' + bytes(31))         # wrong proof
put('auth_handshake', bytes([0, 0xef, 0xef]) + hello(SERVER) + b'\x01' + bytes(32))         # rejected
put('auth_handshake', bytes([0, 0xef, 0xef]) + hello(SERVER) + b'\x02' + bytes(32))         # malformed verdict
put('auth_handshake', bytes([0, 0xef, 0xef]) + hello(SERVER) + b'\x00\x01' + bytes(31))     # wrong server proof
put('auth_handshake', bytes([1, 0xef, 0xef]) + hello(SERVER))                               # same role
put('auth_handshake', bytes([1, 0xef, 0xef]) + hello(CLIENT, magic=b'GET '))
put('auth_handshake', bytes([1, 0xef, 0xef]) + hello(CLIENT, version=2))
put('auth_handshake', bytes([1, 0xef, 0xef]) + hello(7))
put('auth_handshake', bytes([1, 0xef, 0xef]) + hello(CLIENT, pad=1))
put('auth_handshake', bytes([1, 0xef, 0xef]) + hello(CLIENT)[:20])
