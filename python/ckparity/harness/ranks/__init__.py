"""--tp / --dp: the CK twin over the ranks of a torch.distributed group
(``group``), and the processes started on this machine (``launch``)."""
