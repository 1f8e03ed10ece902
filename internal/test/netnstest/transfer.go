package netnstest

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"time"
)

// Transfer sends size bytes over one TCP connection from namespace from to ip in
// namespace to, and checks they all arrive within 30 s.
func Transfer(from, to *os.File, ip netip.Addr, size int) error {
	const port = 9300
	var ln net.Listener
	if err := Enter(to, func() error {
		var err error
		ln, err = net.Listen("tcp", ":"+strconv.Itoa(port))
		return err
	}); err != nil {
		return err
	}
	defer ln.Close()
	got := make(chan int64, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			got <- -1
			return
		}
		defer conn.Close()
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		n, _ := io.Copy(io.Discard, conn)
		got <- n
	}()
	if err := Enter(from, func() error {
		conn, err := net.DialTimeout("tcp", netip.AddrPortFrom(ip, port).String(), 3*time.Second)
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetWriteDeadline(time.Now().Add(30 * time.Second))
		_, err = conn.Write(make([]byte, size))
		return err
	}); err != nil {
		return fmt.Errorf("sending: %w", err)
	}
	if n := <-got; n != int64(size) {
		return fmt.Errorf("%d of %d bytes arrived", n, size)
	}
	return nil
}
