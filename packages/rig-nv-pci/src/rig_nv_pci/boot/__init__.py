"""The GSP's boot and stop: the falcons (falcon), the Ampere/Ada boot through the booters
(ampere), the Blackwell boot through the FSP (fsp, fmc_params, blackwell), the GSP's memory
(gspmem) and the stop (stop)."""
