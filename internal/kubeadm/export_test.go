package kubeadm

// Exported for this package's external tests only.

const ControllerManagerControllers = controllerManagerControllers
