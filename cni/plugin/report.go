package plugin

import (
	"encoding/json"
	"errors"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/trellis-net/trellis/internal/cnicontract"
)

// reported wraps a command so that its outcome and duration reach the node agent's report
// socket (cnicontract.CNIReport). The report never changes or delays the command's result.
func reported(command string, f func(*skel.CmdArgs) error) func(*skel.CmdArgs) error {
	return func(args *skel.CmdArgs) error {
		start := time.Now()
		err := f(args)
		sendReport(reportSocket(args.StdinData), cnicontract.CNIReport{
			Command: command, Result: resultOf(err), Seconds: time.Since(start).Seconds(),
		})
		return err
	}
}

// reportSocket reads only the socket from the configuration: the command itself may have
// failed on the rest of it, and its outcome still counts.
func reportSocket(stdin []byte) string {
	var c struct {
		ReportSocket string `json:"reportSocket"`
	}
	_ = json.Unmarshal(stdin, &c)
	return c.ReportSocket
}

// resultOf classes a command's error by its CNI error code; an error that is not a CNI
// error is reported by skel as an internal one (999).
func resultOf(err error) string {
	if err == nil {
		return cnicontract.ResultSuccess
	}
	var e *types.Error
	if errors.As(err, &e) {
		return cnicontract.ResultClass(e.Code)
	}
	return cnicontract.ResultClass(types.ErrInternal)
}

// sendReport sends one datagram without waiting: the socket is non-blocking and the send
// uses MSG_DONTWAIT, so a missing socket, an agent that is not reading or a full queue
// loses the report and nothing else.
func sendReport(socket string, r cnicontract.CNIReport) {
	if socket == "" {
		return
	}
	b, err := r.Encode()
	if err != nil {
		return
	}
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_DGRAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer syscall.Close(fd)
	_ = syscall.Sendto(fd, b, syscall.MSG_DONTWAIT, &syscall.SockaddrUnix{Name: socket})
}
