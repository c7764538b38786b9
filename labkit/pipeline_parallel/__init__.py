"""Pipeline and interleaved pipeline parallelism (chapters "Pipeline parallelism", "Interleaved pipeline").

Pure (no torch), importable anywhere:
    placement.py   which stages each rank holds, and its consequences: local hand-offs, the ends
    schedules.py   schedules as data: gpipe, one_f_one_b, interleaved, zb_h1, gpipe_v -> per-rank Action lists
    simulate.py    validate and time a schedule; Event / Simulation
    p2p_plan.py    the schedule's point-to-point messages, batched so NCCL cannot deadlock, proven
With torch:
    stage.py       split the dense model into this rank's stages (model chunks)
    executor.py    run a schedule on the stages: run_schedule, PipelineRunner
    plot.py        draw a timeline (matplotlib)
"""
