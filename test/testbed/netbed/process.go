package netbed

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// StopTimeout is how long Stop waits after SIGTERM before it sends SIGKILL.
const StopTimeout = 5 * time.Second

// Process is a command the Bed started inside a namespace (through
// `ip netns exec`, which execs it, so the PID is the command's own). It can be
// stopped, killed and restarted with the same arguments and log file.
type Process struct {
	Name    string
	Netns   *Netns
	Argv    []string
	LogPath string // output of every incarnation, appended

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when the current incarnation exited
	err  error         // its exit status
}

func (b *Bed) start(n *Netns, name string, argv []string) (*Process, error) {
	if len(argv) == 0 {
		return nil, errors.New("netbed: empty command")
	}
	p := &Process{Name: name, Netns: n, Argv: argv,
		LogPath: filepath.Join(b.logDir, n.Name+"-"+name+".log")}
	if err := p.launch(); err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.procs = append(b.procs, p)
	b.mu.Unlock()
	b.logf("netbed: started %s in %s (pid %d): %v", name, n.Name, p.PID(), argv)
	return p, nil
}

func (p *Process) launch() error {
	log, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("netbed: log file: %w", err)
	}
	fmt.Fprintf(log, "==== %s: %v\n", time.Now().Format(time.RFC3339Nano), p.Argv)
	cmd := exec.Command("ip", append([]string{"netns", "exec", p.Netns.Name}, p.Argv...)...)
	cmd.Stdout, cmd.Stderr = log, log
	// Own process group, so a terminal's ^C reaches the test, not the children;
	// the Bed still signals only this PID.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("netbed: start %v in %s: %w", p.Argv, p.Netns.Name, err)
	}
	done := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		log.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// PID returns the current incarnation's process ID.
func (p *Process) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd.Process.Pid
}

// Running reports whether the current incarnation has not exited yet.
func (p *Process) Running() bool {
	select {
	case <-p.doneChan():
		return false
	default:
		return true
	}
}

// Exited returns a channel closed when the current incarnation exits.
func (p *Process) Exited() <-chan struct{} { return p.doneChan() }

// ExitErr returns the exit status of the last incarnation that exited.
func (p *Process) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

func (p *Process) doneChan() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// Signal sends sig to the process (and only to it).
func (p *Process) Signal(sig syscall.Signal) error {
	if !p.Running() {
		return nil
	}
	p.mu.Lock()
	proc := p.cmd.Process
	p.mu.Unlock()
	if err := proc.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("netbed: signal %s (pid %d): %w", p.Name, proc.Pid, err)
	}
	return nil
}

// Stop sends SIGTERM, waits up to StopTimeout, then SIGKILL. It returns once
// the process is gone; stopping a stopped process is not an error.
func (p *Process) Stop() error {
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-p.doneChan():
		return nil
	case <-time.After(StopTimeout):
	}
	return p.Kill()
}

// Kill sends SIGKILL and waits for the process to be gone.
func (p *Process) Kill() error {
	if err := p.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	<-p.doneChan()
	return nil
}

// Restart stops the process (gracefully) and starts it again with the same
// arguments, appending to the same log.
func (p *Process) Restart() error {
	if err := p.Stop(); err != nil {
		return err
	}
	return p.launch()
}

// Log returns everything the process wrote so far (all incarnations).
func (p *Process) Log() string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return fmt.Sprintf("<no log: %v>", err)
	}
	return string(b)
}
