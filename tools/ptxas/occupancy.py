"""Theoretical occupancy of a CUDA kernel per SM, by the rules of CUDA's cuda_occupancy.h,
and the per-block limits the check reports against (48 KB of shared memory without an
opt-in, 1024 threads)."""

SMEM_PER_BLOCK_DEFAULT = 48 * 1024  # without cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)

# Occupancy: the rules of CUDA's cuda_occupancy.h (cudaOccMaxActiveBlocksPerMultiprocessor)
# with the default shared memory carveout and no partitioned global caching.
#   max_threads: threads per SM; max_blocks: resident blocks per SM; smem_sm: shared
#   memory per SM; reserved: shared memory the driver reserves per block (sm_80+);
#   smem_gran: shared memory allocation unit; barrier_mult: barriers per block slot
#   (Hopper and later limit blocks by named barriers too; None: no such limit).
ARCH = {
    75: dict(max_threads=1024, max_blocks=16, smem_sm=64 * 1024, reserved=0, smem_gran=256, barrier_mult=None),
    80: dict(max_threads=2048, max_blocks=32, smem_sm=164 * 1024, reserved=1024, smem_gran=128, barrier_mult=None),
    86: dict(max_threads=1536, max_blocks=16, smem_sm=100 * 1024, reserved=1024, smem_gran=128, barrier_mult=None),
    87: dict(max_threads=2048, max_blocks=16, smem_sm=164 * 1024, reserved=1024, smem_gran=128, barrier_mult=None),
    89: dict(max_threads=1536, max_blocks=24, smem_sm=100 * 1024, reserved=1024, smem_gran=128, barrier_mult=None),
    90: dict(max_threads=2048, max_blocks=32, smem_sm=228 * 1024, reserved=1024, smem_gran=128, barrier_mult=2),
    100: dict(max_threads=2048, max_blocks=32, smem_sm=228 * 1024, reserved=1024, smem_gran=128, barrier_mult=2),
    103: dict(max_threads=2048, max_blocks=32, smem_sm=228 * 1024, reserved=1024, smem_gran=128, barrier_mult=2),
    120: dict(max_threads=1536, max_blocks=24, smem_sm=100 * 1024, reserved=1024, smem_gran=128, barrier_mult=1),
    121: dict(max_threads=1536, max_blocks=24, smem_sm=100 * 1024, reserved=1024, smem_gran=128, barrier_mult=1),
}
WARP = 32
REGS_SM = 65536          # registers per SM (and per block)
REG_UNIT = 256           # register allocation unit, per warp
SUBPARTITIONS = 4        # registers are split over 4 SM sub-partitions
MAX_THREADS_BLOCK = 1024


def round_up(x, unit):
    return -(-x // unit) * unit


def occupancy(sm, threads, regs, smem_static, smem_dynamic, barriers=0):
    """Theoretical occupancy of one kernel on sm_<sm>; None where the arch is unknown."""
    a = ARCH.get(sm)
    if a is None or threads <= 0:
        return None
    max_warps = a["max_threads"] // WARP
    warps_block = -(-threads // WARP)
    limits = {}
    # warps
    limits["warps"] = 0 if threads > MAX_THREADS_BLOCK else max_warps // warps_block
    # registers: per warp, rounded to the allocation unit; warps fit per sub-partition
    regs_warp = round_up(max(regs, 1) * WARP, REG_UNIT)
    if regs_warp * round_up(warps_block, SUBPARTITIONS) > REGS_SM or regs > 255:
        limits["registers"] = 0
    else:
        warps_sm = (REGS_SM // SUBPARTITIONS // regs_warp) * SUBPARTITIONS
        limits["registers"] = warps_sm // warps_block
    # blocks per SM
    limits["blocks"] = a["max_blocks"]
    # shared memory: static + dynamic + the driver's reserve, in allocation units
    smem_block = round_up(smem_static + smem_dynamic + a["reserved"], a["smem_gran"])
    if smem_static + smem_dynamic > SMEM_PER_BLOCK_DEFAULT:
        limits["shared memory"] = 0
    else:
        limits["shared memory"] = a["smem_sm"] // smem_block if smem_block else 10**9
    if a["barrier_mult"] and barriers:
        limits["barriers"] = a["max_blocks"] * a["barrier_mult"] // barriers
    blocks = min(limits.values())
    limiters = [k for k, v in limits.items() if v == blocks]
    warps = blocks * warps_block
    return dict(active_blocks=blocks, active_warps=warps, max_warps=max_warps,
                occupancy=warps / max_warps, limiters=limiters,
                limits={k: (v if v < 10**9 else None) for k, v in limits.items()},
                smem_allocated_per_block=smem_block)
