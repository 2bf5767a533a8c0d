"""--tp / --dp: the processes started on this machine (``launch``), each a
run of the loop; the CK twin over their group is twins/ranked.py."""
