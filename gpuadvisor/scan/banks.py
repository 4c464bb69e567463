"""The warp-lane bank model: how many wavefronts one warp-wide shared-memory instruction takes.

Shared memory has 32 banks, each 4 bytes wide: byte address ``a`` lives in bank ``(a // 4) % 32``. One
wavefront serves at most one 4-byte word per bank, and every lane that reads a word already in the
wavefront gets it for free (broadcast/multicast). The shared data path returns 128 bytes per wavefront,
so wide accesses are split into phases that are served one after another:

- 1, 2 and 4-byte accesses: the whole warp is one phase (ideal: 1 wavefront);
- 8-byte accesses: two half-warps, lanes 0-15 then 16-31 (ideal: 2 wavefronts);
- 16-byte accesses: four quarter-warps of 8 lanes (ideal: 4 wavefronts).

A phase takes as many wavefronts as the busiest bank has distinct words in it; a phase with no active lane
takes none. The *degree* of an access is wavefronts / ideal wavefronts: 1.0 is conflict-free, 32 is the
column read of an unpadded 32x32 float tile. Nsight Compute counts the same quantity:
``l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{ld,st}.sum`` over ``smsp__inst_executed_op_shared_{ld,st}.sum``
is the measured wavefronts per instruction, and ``gpuadvisor ncu`` divides it by the ideal.
"""

from __future__ import annotations

BANKS = 32
BANK_WIDTH_BYTES = 4
WAVEFRONT_BYTES = BANKS * BANK_WIDTH_BYTES  # 128
WARP_SIZE = 32


def lanes_per_phase(width_bytes: int) -> int:
    """Lanes served together: 32 up to 4-byte accesses, 16 for 8 bytes, 8 for 16 bytes."""
    if width_bytes <= BANK_WIDTH_BYTES:
        return WARP_SIZE
    return max(1, WAVEFRONT_BYTES // width_bytes)


def warp_wavefronts(byte_addresses: list[int], active_mask: int, width_bytes: int) -> tuple[int, int]:
    """(wavefronts, ideal wavefronts) of one warp instruction.

    ``byte_addresses[lane]`` is each lane's address; ``active_mask`` has bit ``lane`` set for the lanes that
    execute the instruction; ``width_bytes`` is the access size (1, 2, 4, 8 or 16).
    """
    per_phase = lanes_per_phase(width_bytes)
    words_per_access = max(1, width_bytes // BANK_WIDTH_BYTES)
    wavefronts = 0
    ideal = 0
    for start in range(0, WARP_SIZE, per_phase):
        words_by_bank: dict[int, set[int]] = {}
        for lane in range(start, start + per_phase):
            if not (active_mask >> lane) & 1:
                continue
            first_word = byte_addresses[lane] // BANK_WIDTH_BYTES
            for word in range(first_word, first_word + words_per_access):
                words_by_bank.setdefault(word % BANKS, set()).add(word)
        if words_by_bank:
            wavefronts += max(len(words) for words in words_by_bank.values())
            ideal += 1
    return wavefronts, ideal


def ideal_wavefronts(width_bytes: int) -> int:
    """Ideal wavefronts of a full-warp access of this width: 1 up to 4 bytes, 2 for 8, 4 for 16."""
    return WARP_SIZE // lanes_per_phase(width_bytes)
