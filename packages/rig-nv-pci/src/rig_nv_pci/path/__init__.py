"""The RM path over a booted GSP: rig_nv's Path (pci), built of parts: its RM and GSP client
(rm), what the process hands it of the function (host: BARs, system memory, bus ranges,
placement), its address space and BAR 1 (space) over page tables (mmu), video memory
(vidmem), the process's GPU addresses (addresses), channels and their runlists (channels,
runlists), context buffers (grctx), export, peers and faults."""
