//go:build !linux

package nodeagent

import "syscall"

func freebind(string, string, syscall.RawConn) error { return nil }
