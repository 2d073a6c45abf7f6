"""The one noise-source seam.

Noise for node `index` on tree `level` of stream `stream` is a deterministic function of
(secret, release, distribution, stream, level, index): it is read from SHAKE-128 in counter mode,
one hash call per aligned block of BLOCK nodes, and turned into
- discrete Laplace / discrete Gaussian integers (the default; `discrete.py`, exact tables), or
- standard Laplace (scale 1) or standard Gaussian (variance 1) float64 values (opt-in `float`
  noise: not safe against floating-point attacks).
Every field is length-prefixed (domain separation). `release` binds the noise to one release
(its random id and descriptor digest): two releases never share noise, while the same node of the
same release always gets the same noise in streaming, batch, retries and resumed runs; a node's
noise is never re-drawn, only re-derived. The derivation has a version (`NOISE_VERSIONS`; new
releases take `NOISE_DOMAIN_VERSION`), part of the domain and of the release's descriptor: a
release is continued with the version it started with.

A default source takes its secret from the OS (`secrets`); a fixed seed is used only when the
caller passes one explicitly.
"""
from __future__ import annotations

import abc
import bisect
import collections
import hashlib
import math
import secrets as _secrets
import struct
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

from transforms import validation as check
from .discrete import BitStream, DiscreteSampler
from .privacy import GAUSSIAN, LAPLACE

StreamKey = Union[str, bytes, int]
# the derivation of new releases; bump whenever any node's noise would change for the same key
NOISE_DOMAIN_VERSION = "v4"
# every derivation this code still derives: a release continues with the one it started with
# (v3: a discrete block's sign bits follow all its words; v4: each chunk of SIGN_CHUNK nodes
# has its words, then its sign bits)
NOISE_VERSIONS = ("v3", "v4")
SIGN_CHUNK = 64  # v4: nodes per chunk of a discrete block
_DISTRIBUTION_TAG = {LAPLACE: b"L", GAUSSIAN: b"G"}


def stream_bytes(stream: StreamKey) -> bytes:
    """Canonical, type-tagged bytes of a stream key, so that 1, "1" and b"1" differ."""
    if isinstance(stream, bytes):
        return b"b" + stream
    if isinstance(stream, str):
        return b"s" + stream.encode("utf-8")
    if isinstance(stream, int) and not isinstance(stream, bool):
        return b"i" + str(stream).encode("ascii")
    check.fail("stream", "a str, bytes or int key", stream)


def _uniform_open(raw: bytes) -> np.ndarray:
    """53-bit uniforms strictly inside (0, 1) from little-endian 64-bit words."""
    words = np.frombuffer(raw, dtype="<u8")
    return ((words >> np.uint64(11)).astype(np.float64) + 0.5) * (2.0 ** -53)


def standard_laplace_from_words(words: np.ndarray) -> np.ndarray:
    """Laplace(0, 1) as a random sign times Exp(1): the top 53 bits give u in (0, 1) for
    -log(u), the lowest bit (disjoint from those) gives the sign."""
    u = ((words >> np.uint64(11)).astype(np.float64) + 0.5) * (2.0 ** -53)
    out = np.log(u)
    out.view(np.uint64)[...] ^= words << np.uint64(63)  # flip the sign bit where the bit is 1
    return out


def standard_gaussian_from_uniform(u: np.ndarray) -> np.ndarray:
    """Box-Muller on consecutive pairs (u[2i], u[2i+1]) -> (cos, sin) values at 2i, 2i+1."""
    radius = np.sqrt(-2.0 * np.log(u[0::2]))
    angle = 2.0 * math.pi * u[1::2]
    out = np.empty(u.shape[0], dtype=np.float64)
    out[0::2] = radius * np.cos(angle)
    out[1::2] = radius * np.sin(angle)
    return out


def prefix_length(need: int, block: int) -> int:
    """How many leading nodes of a block to derive when a read needs its first `need`: the
    next power of two >= need, at least 64 (or the whole of a smaller block), the whole block
    beyond half of it. Every node's
    value depends only on its own words and bits (the samplers work element by element, the
    Gaussian on (even, odd) pairs, which a power of two >= 64 never splits), so a block's first
    nodes are the same values whether the rest of it is derived or not; a later read that
    needs more derives the block again, longer (at most five times per block)."""
    need = int(need)
    if need > block // 2:
        return block
    return min(block, max(64, 1 << (need - 1).bit_length()))


def _length_prefixed(*fields: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(f)) + f for f in fields)


def _domain(version: str) -> bytes:
    return b"dp-continual-release/noise/" + version.encode("ascii") + b"\x00"


def _v3_bits(digests: Sequence[bytes], prefixes: Sequence[Tuple[int, int, int]],
             n: int) -> Tuple[np.ndarray, np.ndarray]:
    """(words as bytes, sign bits as bytes) of the prefixes ((level, block, length)) from their
    blocks' SHAKE outputs, v3 layout: a block's n words, then its n sign bits."""
    rows = np.frombuffer(b"".join(digests), dtype=np.uint8).reshape(len(prefixes),
                                                                     8 * n + n // 8)
    lengths = {length for _, _, length in prefixes}
    if len(lengths) == 1:  # whole blocks (a batch), or one prefix: one slice of the rows
        m = lengths.pop()
        return rows[:, :8 * m], rows[:, 8 * n:8 * n + m // 8]
    return (np.concatenate([row[:8 * length] for row, (_, _, length) in zip(rows, prefixes)]),
            np.concatenate([row[8 * n:8 * n + length // 8] for row, (_, _, length)
                            in zip(rows, prefixes)]))


def _v3_sizes(prefixes: Sequence[Tuple[int, int, int]], n: int) -> List[int]:
    return [8 * n + n // 8] * len(prefixes)  # the whole block, whatever the prefix


def _chunked_bits(digests: Sequence[bytes], prefixes: Sequence[Tuple[int, int, int]],
                  n: int) -> Tuple[np.ndarray, np.ndarray]:
    """(words as bytes, sign bits as bytes) of the prefixes, v4 layout: node i's word at byte
    520 (i // 64) + 8 (i % 64) of its block's output, its sign at bit i % 8 of byte
    520 (i // 64) + 512 + (i % 64) // 8 (SIGN_CHUNK = 64)."""
    chunk = SIGN_CHUNK
    size = 8 * chunk + chunk // 8
    if all(length % chunk == 0 for _, _, length in prefixes):
        # whole chunks (every `prefix_length` is): the prefixes' nodes in order are the
        # chunks' in order, one reshape
        rows = np.frombuffer(b"".join(digests), dtype=np.uint8).reshape(-1, size)
        return rows[:, :8 * chunk].reshape(-1), rows[:, 8 * chunk:].reshape(-1)
    words, signs = [], []
    for digest, (_, _, length) in zip(digests, prefixes):
        row = np.frombuffer(digest, dtype=np.uint8).reshape(-1, size)
        words.append(row[:, :8 * chunk].reshape(-1)[:8 * length])
        signs.append(row[:, 8 * chunk:].reshape(-1)[:length // 8])
    return np.concatenate(words), np.concatenate(signs)


def _chunked_sizes(prefixes: Sequence[Tuple[int, int, int]], n: int) -> List[int]:
    size = 8 * SIGN_CHUNK + SIGN_CHUNK // 8
    return [size * -(-length // SIGN_CHUNK) for _, _, length in prefixes]  # its chunks


# each version's discrete block layout: (SHAKE bytes to read per prefix, the split of them)
DISCRETE_LAYOUTS = {"v3": (_v3_sizes, _v3_bits), "v4": (_chunked_sizes, _chunked_bits)}


class NoiseSource(abc.ABC):
    """Noise per node, keyed by (stream, level, index): unit Laplace(0, 1) / N(0, 1) floats, or
    integers from a discrete sampler."""

    version: str = NOISE_DOMAIN_VERSION  # the derivation it implements (`NOISE_VERSIONS`)

    @abc.abstractmethod
    def unit_noise(self, distribution: str, stream: StreamKey, level: int, start: int,
                   count: int) -> np.ndarray:
        """Noise of nodes start .. start+count-1 of `level` in `stream`, as float64."""

    @abc.abstractmethod
    def discrete_noise(self, sampler: DiscreteSampler, stream: StreamKey, level: int,
                       start: int, count: int) -> np.ndarray:
        """Integer noise of nodes start .. start+count-1 (float64 holding exact integers)."""

    def unit_noise_reads(self, distribution: str, stream: StreamKey,
                         reads: Sequence[Tuple[int, int, int]]) -> List[np.ndarray]:
        """`unit_noise` of each (level, start, count) of `reads`, in one call (a source may
        derive them together; the values are those of separate calls)."""
        return [self.unit_noise(distribution, stream, level, start, count)
                for level, start, count in reads]

    def discrete_noise_reads(self, sampler: DiscreteSampler, stream: StreamKey,
                             reads: Sequence[Tuple[int, int, int]]) -> List[np.ndarray]:
        """`discrete_noise` of each (level, start, count) of `reads`, in one call."""
        return [self.discrete_noise(sampler, stream, level, start, count)
                for level, start, count in reads]


class KeyedNoiseSource(NoiseSource):
    """SHAKE-128 counter-mode noise keyed by a secret (the production source; 128-bit security
    for a secret of >= 16 bytes)."""

    BLOCK = 1024  # nodes per hash call; even, so Box-Muller pairs never straddle blocks

    def __init__(self, secret: Union[bytes, str], cache_blocks: int = 4096, *,
                 release: bytes = b"", version: str = NOISE_DOMAIN_VERSION):
        if isinstance(secret, str):
            secret = secret.encode("utf-8")
        if not isinstance(secret, bytes) or len(secret) == 0:
            check.fail("secret", "non-empty bytes or str", secret)
        if not isinstance(release, bytes):
            check.fail("release", "bytes (release id and descriptor digest)", release)
        check.one_of("version", version, NOISE_VERSIONS)
        self.version = version
        self._keyed = hashlib.shake_128(_domain(version) + _length_prefixed(secret, release))
        self._cache: "collections.OrderedDict[tuple, np.ndarray]" = collections.OrderedDict()
        self._cache_blocks = cache_blocks

    def __getstate__(self):  # hashlib objects do not pickle; Beam ships sources to workers
        raise TypeError("KeyedNoiseSource holds a secret and is not serialised; build it on the "
                        "worker from the secret instead")

    def _raw_block(self, distribution, stream: bytes, level: int, block: int,
                   length: int) -> np.ndarray:
        """The first `length` nodes of block `block` (`prefix_length`)."""
        return self._prefixes(distribution, stream, [(level, block, length)])

    def _prefixes(self, distribution, stream: bytes,
                  prefixes: Sequence[Tuple[int, int, int]]) -> np.ndarray:
        """The first `length` nodes of each block of `prefixes` ((level, block, length)),
        concatenated (one sampler pass for all of them)."""
        multiple = 8 if isinstance(distribution, DiscreteSampler) else 2
        for _, _, length in prefixes:
            if length % multiple or not 0 < length <= self.BLOCK:
                check.fail("length", f"a node count of one block, a multiple of {multiple}",
                           length)
        if isinstance(distribution, DiscreteSampler):
            return self._discrete_prefixes(distribution, stream, prefixes)
        return self._float_prefixes(distribution, stream, prefixes)

    def _digests(self, prefix: bytes, blocks: Sequence[Tuple[int, int]],
                 sizes: Sequence[int]) -> List[bytes]:
        """SHAKE-128(key, prefix, level, b) read to `size` bytes, for each (level, b) of
        `blocks` and `size` of `sizes`. The keyed state after `prefix` is copied once
        (absorbing prefix then (level, b) is absorbing their concatenation: the same
        output)."""
        base = self._keyed.copy()
        base.update(prefix)
        pack, copy = struct.Struct("<qq").pack, base.copy
        digests = []
        for (level, b), size in zip(blocks, sizes):
            h = copy()
            h.update(pack(level, b))
            digests.append(h.digest(size))
        return digests

    def _float_prefixes(self, distribution, stream: bytes,
                        prefixes: Sequence[Tuple[int, int, int]]) -> np.ndarray:
        """Block b of `level` is SHAKE-128(key, tag, stream, level, b) read to BLOCK words,
        converted element-wise (Laplace) or in (even, odd) pairs that never straddle blocks
        (Gaussian); its first `length` nodes (an even count) come from the first `length`
        words of the same output (SHAKE's shorter reads are prefixes of its longer ones), so
        converting many prefixes in one pass gives each node the same value as block by
        block."""
        raw = b"".join(self._digests(
            _DISTRIBUTION_TAG[distribution] + struct.pack("<I", len(stream)) + stream,
            [(level, block) for level, block, _ in prefixes],
            [8 * length for _, _, length in prefixes]))
        if distribution == LAPLACE:
            return standard_laplace_from_words(np.frombuffer(raw, dtype="<u8"))
        return standard_gaussian_from_uniform(_uniform_open(raw))

    def _float_blocks(self, distribution, stream: bytes, level: int, first: int,
                      blocks: int) -> np.ndarray:
        """Nodes of `blocks` consecutive whole blocks from `first` (`_float_prefixes`)."""
        return self._float_prefixes(distribution, stream, [(level, b, self.BLOCK) for b in
                                                           range(first, first + blocks)])

    def _block(self, distribution, stream: bytes, level: int, block: int,
               need: int = BLOCK) -> np.ndarray:
        """At least the first `need` nodes of a block (all of it by default), cached."""
        key = (distribution if isinstance(distribution, str) else distribution.tag, stream,
               level, block)
        cache = self._cache
        cached = cache.get(key)
        if cached is None or cached.shape[0] < need:
            grown = cached is not None
            cached = self._raw_block(distribution, stream, level, block,
                                     prefix_length(need, self.BLOCK))
            cache[key] = cached
            if grown:
                cache.move_to_end(key)
            elif len(cache) > self._cache_blocks:
                cache.popitem(last=False)
        else:
            cache.move_to_end(key)
        return cached

    def unit_noise(self, distribution, stream, level, start, count):
        check.one_of("distribution", distribution, (LAPLACE, GAUSSIAN))
        return self._nodes(distribution, stream, level, start, count)

    def discrete_noise(self, sampler, stream, level, start, count):
        if not isinstance(sampler, DiscreteSampler):
            check.fail("sampler", "a DiscreteSampler", sampler)
        return self._nodes(sampler, stream, level, start, count)

    def _nodes(self, distribution, stream, level, start, count) -> np.ndarray:
        if count <= 0:
            return np.zeros(0, dtype=np.float64)
        if start < 0:
            check.fail("start", "a node index >= 0", start)
        key = stream_bytes(stream)
        first, last = start // self.BLOCK, (start + count - 1) // self.BLOCK
        offset = start - first * self.BLOCK
        if last - first < 4:  # whole blocks, and of the last one the nodes up to the read's end
            tail = self._block(distribution, key, level, last, start + count - last * self.BLOCK)
            if last == first:
                joined = tail
            else:
                joined = np.concatenate([self._block(distribution, key, level, b)
                                         for b in range(first, last)] + [tail])
        elif isinstance(distribution, DiscreteSampler):  # batch: one vectorised pass, no cache
            joined = self._discrete_blocks(distribution, key, level, first, last + 1 - first)
        else:
            joined = self._float_blocks(distribution, key, level, first, last + 1 - first)
        return joined[offset:offset + count]

    def unit_noise_reads(self, distribution, stream, reads):
        check.one_of("distribution", distribution, (LAPLACE, GAUSSIAN))
        return self._reads(distribution, stream, reads, 2)

    def discrete_noise_reads(self, sampler, stream, reads):
        if not isinstance(sampler, DiscreteSampler):
            check.fail("sampler", "a DiscreteSampler", sampler)
        return self._reads(sampler, stream, reads, 8)

    def _reads(self, distribution, stream, reads, multiple: int) -> List[np.ndarray]:
        """Reads that are all block prefixes (start at a block's first node, `multiple`
        divides the count) are derived in one pass (`_prefixes`: the same values); any other
        read goes through `_nodes`, one by one."""
        reads = [(int(level), int(start), int(count)) for level, start, count in reads]
        n = self.BLOCK
        if not reads or not all(start >= 0 and start % n == 0 and 0 < count <= n
                                and count % multiple == 0 for _, start, count in reads):
            return [self._nodes(distribution, stream, level, start, count)
                    for level, start, count in reads]
        joined = self._prefixes(distribution, stream_bytes(stream),
                                [(level, start // n, count) for level, start, count in reads])
        parts, at = [], 0
        for _, _, count in reads:
            parts.append(joined[at:at + count])
            at += count
        return parts

    def _discrete_prefixes(self, sampler: DiscreteSampler, stream: bytes,
                           prefixes: Sequence[Tuple[int, int, int]]) -> np.ndarray:
        """Block b of `level` is SHAKE-128(key, "D", sampler, stream, level, b): each node's
        word (the top 64 bits of its uniform) and sign bit; node i's own stream ("T", its
        index) gives the rarely needed low bits and exact tail. The first `length` nodes of
        each block (a multiple of 8) are sampled in one pass, element by element (the same
        values as block by block). Where the sign bits are (`version`):
        - v3: BLOCK words, then BLOCK sign bits (the whole output is read for any prefix);
        - v4: chunks of SIGN_CHUNK nodes, each its words then its sign bits (a prefix reads
          the chunks it covers: SHAKE's shorter reads are prefixes of its longer ones)."""
        n = self.BLOCK
        sizes, split = DISCRETE_LAYOUTS[self.version]
        digests = self._digests(b"D" + _length_prefixed(sampler.tag, stream),
                                [(level, block) for level, block, _ in prefixes],
                                sizes(prefixes, n))
        words, signs = split(digests, prefixes, n)
        # one contiguous, aligned copy at most (the v4 layout's whole chunks are one already)
        top = np.ascontiguousarray(words).view("<u8").reshape(-1).astype(np.uint64, copy=False)
        negative = np.unpackbits(signs.reshape(-1), bitorder="little").view(bool)
        starts = [0]
        for _, _, length in prefixes:
            starts.append(starts[-1] + length)

        def node_bits(i: int) -> BitStream:  # the node's own stream (rarely used)
            j = bisect.bisect_right(starts, i) - 1
            level, block, _ = prefixes[j]
            node = self._keyed.copy()
            node.update(b"T" + _length_prefixed(sampler.tag, stream)
                        + struct.pack("<qq", level, block * n + i - starts[j]))
            return BitStream(node.digest)

        return sampler.sample(top, negative, node_bits).astype(np.float64)

    def _discrete_blocks(self, sampler: DiscreteSampler, stream: bytes, level: int,
                         first: int, blocks: int) -> np.ndarray:
        """Nodes of `blocks` consecutive whole blocks from `first` (`_discrete_prefixes`)."""
        return self._discrete_prefixes(sampler, stream, [(level, b, self.BLOCK) for b in
                                                         range(first, first + blocks)])


class ConstantNoiseSource(NoiseSource):
    """Every node's unit noise is `value` (tests: counts nodes per step, TF-Privacy style)."""

    def __init__(self, value: float = 1.0):
        self.value = float(value)

    def unit_noise(self, distribution, stream, level, start, count):
        return np.full(max(count, 0), self.value, dtype=np.float64)

    def discrete_noise(self, sampler, stream, level, start, count):
        return np.full(max(count, 0), self.value, dtype=np.float64)


def seed_secret(seed: int) -> bytes:
    """The (public, not private) secret an explicit seed stands for."""
    check.integer_at_least("seed", seed, 0)
    return b"explicit-seed:" + str(int(seed)).encode("ascii")


def make_noise_source(seed: Optional[int] = None, secret: Union[bytes, str, None] = None,
                      release: bytes = b"", version: str = NOISE_DOMAIN_VERSION) -> NoiseSource:
    """The production source: OS secret by default, an explicit `seed` or `secret` if given;
    `release` binds it to one release, `version` is its derivation (see the module
    docstring)."""
    if seed is not None and secret is not None:
        check.fail("seed", "None when `secret` is given (pass at most one of them)", seed)
    if seed is not None:
        secret = seed_secret(seed)
    elif secret is None:
        secret = _secrets.token_bytes(32)
    return KeyedNoiseSource(secret, release=release, version=version)
