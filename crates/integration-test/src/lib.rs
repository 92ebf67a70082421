//! nsfast's integration tests live in `tests/`: each file is one test binary that runs the
//! shipped `nsfast` (or `$NSFAST_BIN`, a VM guest's `/bin/nsfast`) against throwaway
//! namespaces, cgroups and BPF pins it removes afterwards. Helpers the files share are in
//! `tests/common`. This library is empty: a package needs a target besides its tests.
