module github.com/polyloop/polyloop

go 1.26.8

require (
	github.com/oklog/ulid/v2 v2.1.2
	github.com/vmihailenco/msgpack/v5 v5.4.1
)

require (
	github.com/stretchr/testify v1.10.0 // indirect
	github.com/vmihailenco/tagparser/v2 v2.0.0 // indirect
	go.etcd.io/bbolt v1.4.3 // indirect
	golang.org/x/sys v0.29.0 // indirect
)
