package qemu

// pids returns the process IDs of the VM's QEMU and swtpm.
func (v *VM) pids() []int {
	return []int{v.qemu.cmd.Process.Pid, v.tpm.cmd.Process.Pid}
}
