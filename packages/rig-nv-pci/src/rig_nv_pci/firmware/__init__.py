"""NVIDIA's firmware as rig-nv-pci reads it: the GSP and booter images (fwimage), the VBIOS
and its FWSEC (vbios), the FB layout and WPR meta (layout), the chips and their families
(chips)."""
