module kubelet-dra/tests/node/pause

go 1.26.0
