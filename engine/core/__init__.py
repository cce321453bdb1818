"""One engine on one device: config, device names, sequences, the KV pool and its blocks, scheduler,
sampler, model runner, outputs, and snapshots of its sessions. May import metrics, model, kernels."""
