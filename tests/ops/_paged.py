"""A random paged KV cache for attention tests: pages handed out in a scrambled order, so a kernel that ignores the
block table reads the wrong tokens."""

import torch


def random_paged_cache(lengths, nkv, d, page_size, dtype, device, spare_pages=3):
    """Returns (k_pages, v_pages [P, page_size, nkv, d], block_table [B, max_pages] int32) covering ``lengths``."""
    need = [-(-n // page_size) for n in lengths]
    max_pages = max(max(need), 1) + 1
    total = sum(need) + spare_pages
    perm = torch.randperm(total).tolist()
    # unused table entries point at page 0 and the kernel must never read them
    table = torch.zeros(len(lengths), max_pages, dtype=torch.int32)
    i = 0
    for b, n in enumerate(need):
        table[b, :n] = torch.tensor(perm[i:i + n], dtype=torch.int32)
        i += n
    k = torch.randn(total, page_size, nkv, d).to(dtype)
    v = torch.randn(total, page_size, nkv, d).to(dtype)
    return k.to(device), v.to(device), table.to(device)
