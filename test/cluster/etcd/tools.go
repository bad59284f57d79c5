//go:build tools

// Package tools records the etcd command this module builds (the server
// module's root package is etcd's main), so `go mod tidy` keeps its
// dependencies. Never compiled; cluster.ts builds the command.
package tools

import _ "go.etcd.io/etcd/server/v3"
