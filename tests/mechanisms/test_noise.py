"""The keyed noise seam: determinism, independence of keys, distributions."""
from __future__ import annotations

import pickle
import struct

import numpy as np
import pytest
from scipy import stats

from transforms.mechanisms.noise import (NOISE_VERSIONS, ConstantNoiseSource, KeyedNoiseSource,
                                         make_noise_source, prefix_length, stream_bytes)


def test_same_node_same_noise_across_block_boundaries_and_access_patterns():
    source = KeyedNoiseSource(b"secret")
    whole = source.unit_noise("laplace", "k", 3, 0, 5000)
    pieces = np.concatenate([source.unit_noise("laplace", "k", 3, a, b - a)
                             for a, b in ((0, 1), (1, 1023), (1023, 1025), (1025, 5000))])
    assert np.array_equal(whole, pieces)
    fresh = KeyedNoiseSource(b"secret")  # a rerun in another process
    assert np.array_equal(fresh.unit_noise("laplace", "k", 3, 2000, 7), whole[2000:2007])


def test_keys_separate_secret_stream_level_and_distribution():
    source = KeyedNoiseSource(b"secret")
    base = source.unit_noise("gaussian", "k", 0, 0, 64)
    others = [KeyedNoiseSource(b"secreT").unit_noise("gaussian", "k", 0, 0, 64),
              source.unit_noise("gaussian", "k2", 0, 0, 64),
              source.unit_noise("gaussian", "k", 1, 0, 64),
              source.unit_noise("laplace", "k", 0, 0, 64)]
    for other in others:
        assert np.corrcoef(base, other)[0, 1] ** 2 < 0.2
        assert not np.any(base == other)
    assert len({stream_bytes(1), stream_bytes("1"), stream_bytes(b"1")}) == 3


@pytest.mark.parametrize("distribution,reference", [("laplace", "laplace"), ("gaussian", "norm")])
def test_unit_noise_has_the_standard_distribution(distribution, reference):
    """KS test on 200k values (false-failure rate 1e-4)."""
    values = KeyedNoiseSource(b"ks").unit_noise(distribution, "s", 0, 0, 200_000)
    assert stats.kstest(values, reference).pvalue > 1e-4
    assert np.all(np.isfinite(values))


def test_seed_is_explicit_and_default_secret_is_random():
    a = make_noise_source(seed=5).unit_noise("laplace", "", 0, 0, 8)
    assert np.array_equal(a, make_noise_source(seed=5).unit_noise("laplace", "", 0, 0, 8))
    b = make_noise_source().unit_noise("laplace", "", 0, 0, 8)
    c = make_noise_source().unit_noise("laplace", "", 0, 0, 8)
    assert not np.array_equal(b, c)


def test_secret_source_refuses_to_be_pickled():
    with pytest.raises(TypeError, match="secret"):
        pickle.dumps(KeyedNoiseSource(b"secret"))


@pytest.mark.parametrize("call,message", [
    (lambda: make_noise_source(seed=1, secret=b"x"),
     r"^`seed` must be None when `secret` is given \(pass at most one of them\); got 1\.$"),
    (lambda: make_noise_source(seed=-1), r"^`seed` must be an integer >= 0; got -1\.$"),
    (lambda: KeyedNoiseSource(b""), r"^`secret` must be non-empty bytes or str; got b''\.$"),
    (lambda: stream_bytes(1.5), r"^`stream` must be a str, bytes or int key; got 1\.5\.$"),
    (lambda: KeyedNoiseSource(b"x").unit_noise("cauchy", "", 0, 0, 1),
     r"^`distribution` must be one of 'laplace', 'gaussian'; got 'cauchy'\.$"),
])
def test_noise_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_constant_source_is_constant():
    assert ConstantNoiseSource(2.5).unit_noise("laplace", "", 4, 10, 3).tolist() == [2.5] * 3


# Digests of the seam's output over 9 blocks (the vectorised many-block path), computed with the
# block-by-block implementation before it was vectorised: every node keeps its noise.
# v4 (each chunk of 64 nodes its words, then its sign bits) was pinned when it was introduced,
# its block-by-block reads checked against its whole blocks below. A release keeps its version.
SEAM_GOLDEN = {("v3", "laplace"): "83a8302eb6eb3c24", ("v3", "gaussian"): "6f5122f1812d5555",
               ("v3", "discrete_laplace"): "990b528ed30f078e",
               ("v3", "discrete_gaussian"): "4128889ae5055524",
               ("v4", "laplace"): "7c8134742886622a", ("v4", "gaussian"): "394c16d22156207b",
               ("v4", "discrete_laplace"): "66cc1e29e95eead6",
               ("v4", "discrete_gaussian"): "b9ddd8bfc8a5d8fc"}
LAWS = ["discrete_gaussian", "discrete_laplace", "gaussian", "laplace"]


def _seam_draw(source, law, start, count, level=5):
    from transforms.mechanisms import discrete
    if law.startswith("discrete_"):
        parameter = 3.5 if law == discrete.DISCRETE_LAPLACE else 20.0
        return source.discrete_noise(discrete.sampler(law, parameter), "s", level, start, count)
    return source.unit_noise(law, "s", level, start, count)


@pytest.mark.parametrize("law", LAWS)
def test_a_block_read_in_growing_prefixes_equals_the_whole_block(law):
    """A read of a block's first nodes derives only a prefix of it (`prefix_length`: 64, 128,
    ... nodes, the whole block beyond half of it), and a read needing more derives it again,
    longer; every node is the same bits as in the whole block."""
    whole = _seam_draw(KeyedNoiseSource(b"seam-golden", release=b"r"), law, 2048, 1024)
    source = KeyedNoiseSource(b"seam-golden", release=b"r")
    derived = []
    for need in (1, 7, 64, 65, 130, 300, 513, 1024):
        got = _seam_draw(source, law, 2048, need)
        assert np.array_equal(got.view(np.uint64), whole[:need].view(np.uint64)), need
        derived.append(next(iter(source._cache.values())).shape[0])
    assert derived == [64, 64, 64, 128, 256, 512, 1024, 1024]
    # a read in the middle of a block derives up to its end
    middle = KeyedNoiseSource(b"seam-golden", release=b"r")
    assert np.array_equal(_seam_draw(middle, law, 2048 + 100, 20).view(np.uint64),
                          whole[100:120].view(np.uint64))
    assert next(iter(middle._cache.values())).shape[0] == 128


@pytest.mark.parametrize("need,length", [(1, 64), (64, 64), (65, 128), (256, 256),
                                         (257, 512), (512, 512), (513, 1024), (1024, 1024)])
def test_prefix_length(need, length):
    assert prefix_length(need, 1024) == length


@pytest.mark.parametrize("law", LAWS)
def test_a_source_with_blocks_smaller_than_a_prefix_reads_whole_blocks(law):
    """A block of 32 nodes is never cut below 64 nodes (found by an attack: the source
    refused its first short read)."""
    class Small(KeyedNoiseSource):
        BLOCK = 32

    assert prefix_length(5, 32) == 32
    whole = _seam_draw(Small(b"seam-golden", release=b"r"), law, 64, 64)  # two whole blocks
    assert np.array_equal(_seam_draw(Small(b"seam-golden", release=b"r"), law, 64, 5)
                          .view(np.uint64), whole[:5].view(np.uint64))


@pytest.mark.parametrize("law", LAWS)
@pytest.mark.parametrize("version", NOISE_VERSIONS)
def test_many_block_derivation_is_unchanged_and_equals_block_by_block(law, version):
    import hashlib
    source = KeyedNoiseSource(b"seam-golden", release=b"r", version=version)
    whole = _seam_draw(source, law, 1000, 9000)
    digest = hashlib.sha256(np.round(whole, 6).tobytes()).hexdigest()[:16]
    assert digest == SEAM_GOLDEN[(version, law)]
    # the same nodes read through the small (cached, block-by-block) path, in random pieces
    rng = np.random.default_rng(7)
    cuts = np.unique(np.concatenate([[0, 9000], rng.integers(1, 9000, 12)]))
    fresh = KeyedNoiseSource(b"seam-golden", release=b"r", version=version)
    pieces = np.concatenate([_seam_draw(fresh, law, 1000 + a, b - a)
                             for a, b in zip(cuts[:-1], cuts[1:])])
    assert np.array_equal(pieces.view(np.uint64), whole.view(np.uint64))
    # and one node at a time at block edges and in the middle
    for i in (0, 23, 24, 1047, 1048, 5000, 8999):
        assert _seam_draw(KeyedNoiseSource(b"seam-golden", release=b"r", version=version),
                          law, 1000 + i, 1)[0] == whole[i]


def _law(law, tail_from=None):
    """(the law as the source takes it, the source's batched reads method name, single)."""
    from transforms.mechanisms import discrete
    if law.startswith("discrete_"):
        sampler = discrete.DiscreteSampler(law, 3.5 if law == discrete.DISCRETE_LAPLACE
                                           else 20.0)
        if tail_from is not None:
            sampler.size = tail_from  # most nodes take the exact tail, by their own stream
        return sampler, "discrete_noise_reads", "discrete_noise"
    return law, "unit_noise_reads", "unit_noise"


@pytest.mark.parametrize("law", LAWS)
@pytest.mark.parametrize("tail_from", [None, 1])
@pytest.mark.parametrize("reads", [
    [(5, 2048, 64), (0, 0, 1024), (3, 1024, 128), (5, 0, 512), (13, 4096, 64)],  # prefixes
    [(2, 3072, 8), (2, 3072, 1024), (0, 0, 16)],  # one pass (8: the discrete laws' least)
    [(5, 2048, 64), (2, 100, 30), (1, 0, 1030), (0, 5000, 1)],  # not all prefixes: one by one
])
def test_reads_in_one_call_equal_the_same_reads_one_by_one(law, tail_from, reads):
    """Block prefixes of several levels and blocks are derived in one sampler pass; each node
    is the same bits as read alone (also where the exact tail reads the node's own stream,
    which the pass finds by the node's level and index)."""
    if tail_from is not None and not law.startswith("discrete_"):
        pytest.skip("float laws have no tail sampler")
    if not law.startswith("discrete_") and reads[1][2] == 1024 and reads[0][2] == 8:
        reads = [(level, start, max(count, 16)) for level, start, count in reads]
    distribution, many, one = _law(law, tail_from)
    got = getattr(KeyedNoiseSource(b"seam-golden", release=b"r"), many)(distribution, "s",
                                                                          reads)
    assert len(got) == len(reads)
    for (level, start, count), values in zip(reads, got):
        alone = getattr(KeyedNoiseSource(b"seam-golden", release=b"r"), one)(
            distribution, "s", level, start, count)
        assert values.shape == (count,)
        assert np.array_equal(values.view(np.uint64), alone.view(np.uint64))
    assert ConstantNoiseSource(2.0).discrete_noise_reads(None, "s", reads)[0].tolist() == \
        [2.0] * reads[0][2]


@pytest.mark.parametrize("version", NOISE_VERSIONS)
def test_discrete_words_and_sign_bits_are_where_the_layout_says(version):
    """Each node's word and sign bit are read from the bytes its version documents, for whole
    blocks (one reshape), one prefix and mixed prefixes (row by row): v3 the block's words then
    its sign bits; v4 per chunk of 64 nodes its words then their sign bits, so a prefix of m
    nodes reads 520 ceil(m / 64) bytes of SHAKE instead of the whole block's 8320."""
    from transforms.mechanisms import discrete
    from transforms.mechanisms.noise import DISCRETE_LAYOUTS
    sampler = discrete.DiscreteSampler(discrete.DISCRETE_GAUSSIAN, 20.0)
    source = KeyedNoiseSource(b"layout", release=b"r", version=version)
    stream = stream_bytes("s")
    sizes = []
    digests = source._digests

    def recording(prefix, blocks, lengths):
        sizes.extend(lengths)
        return digests(prefix, blocks, lengths)
    source._digests = recording
    n = source.BLOCK
    whole = {(level, block): source._keyed.copy() for level, block in [(2, 0), (2, 1), (5, 3)]}
    for (level, block), h in whole.items():
        h.update(b"D" + struct.pack("<I", len(sampler.tag)) + sampler.tag
                 + struct.pack("<I", len(stream)) + stream + struct.pack("<qq", level, block))
    for prefixes in ([(2, 0, n), (2, 1, n)], [(5, 3, 64)], [(2, 0, 8), (5, 3, 200), (2, 1, n)]):
        sizes.clear()
        source._discrete_prefixes(sampler, stream, prefixes)  # records what it reads
        read = digests(b"D" + struct.pack("<I", len(sampler.tag)) + sampler.tag
                       + struct.pack("<I", len(stream)) + stream,
                       [(level, block) for level, block, _ in prefixes], sizes)
        words, signs = DISCRETE_LAYOUTS[version][1](read, prefixes, n)
        top = np.ascontiguousarray(words).view("<u8").reshape(-1)
        negative = np.unpackbits(np.ascontiguousarray(signs).reshape(-1), bitorder="little")
        at = 0
        for level, block, length in prefixes:
            raw = whole[(level, block)].digest(8 * n + n // 8 + 520)
            for i in range(length):
                if version == "v3":
                    word, sign = 8 * i, 8 * n + i // 8
                else:
                    chunk = 520 * (i // 64)
                    word, sign = chunk + 8 * (i % 64), chunk + 512 + (i % 64) // 8
                assert int(top[at + i]) == int.from_bytes(raw[word:word + 8], "little")
                assert int(negative[at + i]) == (raw[sign] >> (i % 8)) & 1
            at += length
        assert at == top.shape[0] == negative.shape[0]
        expected = [8 * n + n // 8 if version == "v3" else 520 * -(-length // 64)
                    for _, _, length in prefixes]
        assert sizes == expected
