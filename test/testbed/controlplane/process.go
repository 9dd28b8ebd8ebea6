package controlplane

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// process is a child process (etcd, kube-apiserver) with its output in a log
// file. It is stopped by its PID only.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process has exited
	err     error         // exit status, valid once done is closed
}

// startProcess starts bin with args, stdout and stderr appended to logPath.
// The child gets SIGKILL if the test binary dies first (Pdeathsig), so a
// crashed test does not leave it behind.
func startProcess(name, logPath, bin string, args ...string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("controlplane: %s log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = childEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p := &process{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// Pdeathsig fires when the forking OS thread ends, not the test
		// process, and the Go runtime ends threads that a goroutine leaves
		// locked (netns helpers do). So fork from a thread that stays
		// locked to this goroutine, blocked in Wait, for as long as the
		// child runs, then unlock it: the thread may have forked other
		// children before (netbed's kproxy, when the API server is
		// restarted mid-test), and ending it would kill them.
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			runtime.UnlockOSThread()
			started <- err
			return
		}
		started <- nil
		p.err = cmd.Wait()
		runtime.UnlockOSThread()
		logFile.Close()
		close(p.done)
	}()
	if err := <-started; err != nil {
		logFile.Close()
		return nil, fmt.Errorf("controlplane: start %s: %w", name, err)
	}
	return p, nil
}

// exited reports whether the process has ended, and how.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// stop sends SIGTERM to the process (by PID), and SIGKILL if it has not
// exited after grace. Stopping an exited process is not an error.
func (p *process) stop(grace time.Duration) error {
	if p == nil {
		return nil
	}
	if done, _ := p.exited(); done {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	_ = p.cmd.Process.Kill()
	select {
	case <-p.done:
		return nil
	case <-time.After(5 * time.Second):
		return fmt.Errorf("controlplane: %s (pid %d) did not exit after SIGKILL", p.name, p.cmd.Process.Pid)
	}
}

// childEnv is the test's environment without ETCD_* variables, which etcd
// would read as flags.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ETCD_") {
			env = append(env, kv)
		}
	}
	return env
}

// logTail returns the last n bytes of the process log, for error messages.
func (p *process) logTail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(b) > n {
		b = b[len(b)-n:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

// exitError describes a process that ended while it should be running.
func (p *process) exitError() error {
	_, err := p.exited()
	if err == nil {
		err = errors.New("exit status 0")
	}
	return fmt.Errorf("controlplane: %s exited early: %w\n--- %s (tail) ---\n%s", p.name, err, p.logPath, p.logTail(3000))
}
