"""The KV tiers under the workers' pools, node-wide (issue: tiered KV): block records that check
themselves (`block_file`), bounded LRU tiers of them in a folder each (`file_tier`: host memory under /dev/shm,
disk), and the tiers together (`tiers`). Torch-free: it stores and returns bytes; the engine lays its
blocks' K/V out into them and back."""
