"""The RM path over a booted GSP: rig_nv's Path (pci), its RM (rm), the process's GPU
addresses (addresses), page tables (mmu), video memory (vidmem), channels and their runlists
(channels, runlists), context buffers (grctx), export, peers and faults."""
