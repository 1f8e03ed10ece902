// Command workload is the test pods' workload: a TCP+UDP responder and a client for it.
//
//	workload serve --port N
//	    answers every TCP connection and UDP datagram on port N with one line
//	    "hostname=H local=IP:PORT remote=IP:PORT" (remote is the peer as the server sees it).
//	workload connect HOST:PORT [--udp] [--timeout 5s]
//	    connects (or sends one datagram, retried until the timeout), prints the server's
//	    line and exits 0; exits 1 when no answer came within the timeout.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/trellis-net/trellis/internal/test/check"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "connect":
		err = connect(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "workload %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: workload serve --port N | workload connect HOST:PORT [--udp] [--timeout D]")
	os.Exit(2)
}

// parseInterspersed parses fs with flags allowed before and after the positional arguments.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return positional, nil
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	port := fs.Int("port", 8080, "TCP and UDP port to answer on")
	if _, err := parseInterspersed(fs, args); err != nil {
		return err
	}
	hostname, err := os.Hostname()
	if err != nil {
		return fmt.Errorf("reading the hostname: %w", err)
	}
	addr := fmt.Sprintf(":%d", *port)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening on tcp %s: %w", addr, err)
	}
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return fmt.Errorf("listening on udp %s: %w", addr, err)
	}
	fmt.Printf("serving tcp and udp on %s as %s\n", addr, hostname)

	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				fmt.Fprintf(os.Stderr, "accept: %v\n", err)
				return
			}
			go func() {
				defer conn.Close()
				_ = conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
				fmt.Fprintf(conn, "hostname=%s local=%s remote=%s\n", hostname, conn.LocalAddr(), conn.RemoteAddr())
			}()
		}
	}()
	go func() {
		buf := make([]byte, 2048)
		for {
			_, peer, err := pc.ReadFrom(buf)
			if err != nil {
				fmt.Fprintf(os.Stderr, "udp read: %v\n", err)
				return
			}
			// The local address of an unconnected UDP socket is the wildcard; report the
			// address this datagram would be answered from.
			local := pc.LocalAddr().String()
			if c, err := net.Dial("udp", peer.String()); err == nil {
				local = c.LocalAddr().(*net.UDPAddr).IP.String() + fmt.Sprintf(":%d", *port)
				c.Close()
			}
			reply := fmt.Sprintf("hostname=%s local=%s remote=%s\n", hostname, local, peer)
			if _, err := pc.WriteTo([]byte(reply), peer); err != nil {
				fmt.Fprintf(os.Stderr, "udp write to %s: %v\n", peer, err)
			}
		}
	}()

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	<-sigs
	return nil
}

func connect(args []string) error {
	fs := flag.NewFlagSet("connect", flag.ContinueOnError)
	udp := fs.Bool("udp", false, "send a UDP datagram instead of opening a TCP connection")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the answer")
	positional, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(positional) != 1 {
		return errors.New("want exactly one HOST:PORT")
	}
	target := positional[0]
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var line string
	if *udp {
		line, err = connectUDP(ctx, target)
	} else {
		line, err = connectTCP(ctx, target)
	}
	if err != nil {
		return err
	}
	fmt.Println(line)
	return nil
}

func connectTCP(ctx context.Context, target string) (string, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", target)
	if err != nil {
		return "", fmt.Errorf("dialing tcp %s: %w", target, err)
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetReadDeadline(deadline)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("reading the answer of tcp %s: %w", target, err)
	}
	return strings.TrimSpace(line), nil
}

func connectUDP(ctx context.Context, target string) (string, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "udp", target)
	if err != nil {
		return "", fmt.Errorf("dialing udp %s: %w", target, err)
	}
	defer conn.Close()
	buf := make([]byte, 2048)
	var answer string
	err = check.Until(ctx, 100*time.Millisecond, "a udp answer from "+target, func(context.Context) error {
		if _, err := conn.Write([]byte("ping\n")); err != nil {
			return err
		}
		_ = conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		n, err := conn.Read(buf)
		if err != nil {
			return err
		}
		answer = strings.TrimSpace(string(buf[:n]))
		return nil
	})
	return answer, err
}
