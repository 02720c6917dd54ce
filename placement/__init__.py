"""Resources, plans and routing decisions: NVML/psutil discovery, pools, packing, routers.

Pure logic plus discovery. Imports nothing of ours but the error types in ``transport``.
"""
