/* The privileged nub: the only guest code that runs at CPL0.
 *
 * On this platform every CPL0 instruction is emulated by KVM (~1 us each), so
 * each path here is a few dozen integer instructions at most; everything else
 * runs in the CPL3 runtime. Named operands (in curly braces) are filled in by
 * nub.rs; %gs points at this CPU's PerCpu (percpu.rs) once the runtime has
 * set it up.
 *
 * Entry state (set by the monitor, docs/ABI.md): 64-bit mode, CPL0, IF=0,
 * identity paging with the U bit, RDI = boot-info gpa, RSI = vCPU index,
 * RSP = this vCPU's boot stack, placeholder GDT/TSS, empty IDT.
 */
    .section .text.boot, "ax"
    .code64
    .global _start
_start:
    rdtsc                           /* boot TSC: rdx = high, eax = low */
    mov %eax, %ecx                  /* rust_start(boot_info, cpu, tsc_hi, tsc_lo) */
    lidt idt_ptr(%rip)              /* gates are filled by vCPU 0 at CPL3 */
    lea 1(%rsi), %rax
    imul ${main_stack_size}, %rax
    lea {main_stacks}(%rip), %r8
    add %r8, %rax
    sub $8, %rax                    /* as if called: rsp % 16 == 8 at entry */
    pushq ${user_ds}
    push %rax
    pushq $0x202
    pushq ${user_cs}
    lea {rust_start}(%rip), %rax
    push %rax
    iretq

    .text
/* Nub calls: `int3` from CPL3 (vector 3, DPL3 gate), rax = operation,
 * rdi/rsi = arguments, result in rax. rcx and rdx are clobbered. The gate is
 * an interrupt gate, so each call runs with interrupts off. */
    .global hover_nub_call
hover_nub_call:
    cmp ${nub_ops}, %rax
    jae 9f
    jmp *nub_table(,%rax,8)
9:  mov $-1, %rax
    iretq

nub_load_tables:                    /* rdi = &gdtr, rsi = TSS selector */
    lgdt (%rdi)
    ltr %si
    iretq

nub_rdmsr:                          /* rdi = msr -> rax */
    mov %edi, %ecx
    rdmsr
    shl $32, %rdx
    or %rdx, %rax
    iretq

nub_wrmsr:                          /* rdi = msr, rsi = value */
    mov %edi, %ecx
    mov %esi, %eax
    mov %rsi, %rdx
    shr $32, %rdx
    wrmsr
    iretq

/* Halt until an interrupt, unless a reschedule is already due: checking
 * need_resched here, with interrupts off, closes the window between the
 * idle loop's last look and the hlt (sti delays interrupts by one insn). */
nub_halt:
    cmpq $0, %gs:{off_need_resched}
    jne nub_halt_woken
    sti
    hlt
nub_halt_woken:                     /* the RIP of every interrupt taken at hlt */
    iretq

nub_set_deadline:                   /* rdi = TSC deadline (0 disarms) */
    mov %rdi, %gs:{off_armed_deadline}
    mov $0x6e0, %ecx
    mov %edi, %eax
    mov %rdi, %rdx
    shr $32, %rdx
    wrmsr
    iretq

nub_triple_fault:                   /* no IDT + an exception = shutdown */
    lidt null_idt_ptr(%rip)
    ud2

/* ---- interrupts -------------------------------------------------------
 * Every handler has three paths. In preemptible code (preempt_count 0) it
 * takes the count, keeps rax, rcx, rdx in PerCpu.irq_saved, does its work
 * and returns into hover_irq_entry (switch.S) with rax = the interrupted
 * RIP; the entry takes the registers back, steps over the red zone, saves
 * the rest at native speed and reschedules. At nub_halt's hlt it only does
 * its work: the nub call clobbers rax, rcx and rdx anyway, and every caller
 * of halt schedules when it returns (but control.rs's exit loop, which
 * halts for good). Elsewhere (the runtime's critical sections) it saves
 * them on the stack, does its work, asks for a reschedule at the next
 * preemption point and returns: irq_saved is not touched there, since an
 * interrupt can come before the entry has taken it. The frame's privilege
 * needs no test: interrupts reach CPL0 code only at nub_halt's hlt (every
 * gate clears IF), and the runtime halts only with preemption off
 * (nub.rs), so preempt_count alone says "not here".
 * Slow-path stack: 0 rdx, 8 rcx, 16 rax, 24 rip, 32 cs, ...
 * Every instruction here costs ~1 us (emulated): the counts matter. */

.macro IRQ_ENTER slow
    cmpq $0, %gs:{off_preempt_count}
    jne \slow
    movq $1, %gs:{off_preempt_count}
    mov %rax, %gs:{off_irq_rax}
    mov %rcx, %gs:{off_irq_rcx}
    mov %rdx, %gs:{off_irq_rdx}
.endm

/* (The image is linked low, so the entry's address is a 32-bit immediate.) */
.macro IRQ_REDIRECT
    mov (%rsp), %rax
    movq $hover_irq_entry, (%rsp)
    iretq
.endm

/* Not preemptible: at nub_halt's hlt go to \halted, otherwise save rax,
 * rcx, rdx on the stack. */
.macro IRQ_SLOW_ENTER halted
    cmpq $nub_halt_woken, (%rsp)
    je \halted
    push %rax
    push %rcx
    push %rdx
.endm

.macro IRQ_SLOW_EXIT
    movq $1, %gs:{off_need_resched}
    pop %rdx
    pop %rcx
    pop %rax
    iretq
.endm

/* x2APIC end-of-interrupt; leaves eax = edx = 0. (KVM's PV EOI would save
 * the write, but this host's KVM never sets its flag: measured, docs/ABI.md.) */
.macro EOI
    mov $0x80b, %ecx
    xor %eax, %eax
    xor %edx, %edx
    wrmsr
.endm

/* Tick or sleeper deadline: count it, EOI, rearm a tick ahead. */
.macro TIMER_WORK
    incq %gs:{off_ticks}
    EOI
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    add %gs:{off_tick_period}, %rax
    mov %rax, %gs:{off_armed_deadline}
    mov %rax, %rdx
    shr $32, %rdx
    mov $0x6e0, %ecx
    wrmsr
.endm

    .global hover_timer_irq
hover_timer_irq:
    IRQ_ENTER 1f
    TIMER_WORK
    IRQ_REDIRECT
1:  IRQ_SLOW_ENTER 2f
    TIMER_WORK
    IRQ_SLOW_EXIT
2:  TIMER_WORK
    iretq

    .global hover_resched_irq
hover_resched_irq:                  /* another vCPU queued a task here */
    IRQ_ENTER 1f
    EOI
    IRQ_REDIRECT
1:  IRQ_SLOW_ENTER 2f
    EOI
    IRQ_SLOW_EXIT
2:  EOI
    iretq

irq_device:                         /* stack: the vector (from its stub), the frame */
    IRQ_ENTER 1f
    pop %rax
    lock btsq %rax, %gs:{off_pending_irqs}
    EOI
    IRQ_REDIRECT
1:  cmpq $nub_halt_woken, 8(%rsp)
    je 2f
    xchg %rax, (%rsp)               /* the vector's slot keeps rax */
    push %rcx
    push %rdx
    lock btsq %rax, %gs:{off_pending_irqs}
    EOI
    IRQ_SLOW_EXIT
2:  pop %rax
    lock btsq %rax, %gs:{off_pending_irqs}
    EOI
    iretq

/* #PF: an async "page not present" from KVM (the area's flags say so, CR2
 * holds the token) or a real fault. Preemptible code is redirected as an
 * interrupt is, into hover_fault_entry with preempt_count = 2 ("from a
 * #PF"), rax kept in irq_saved and CR2 in apf_park_token: the runtime tells
 * async from real by the flags there, at native speed, clears them and
 * parks the task; a real fault it returns to with preemption off, so that
 * the access faults again and takes the path below. Non-preemptible code:
 * an async "not present" just returns (the access faults again, and KVM,
 * seeing a fault for a page already being fetched, halts the vCPU until
 * the page is there: the seed's rule for non-preemptible contexts); a real
 * fault is reported.
 * Stack: 0 error, 8 rip, 16 cs, 24 rflags, 32 rsp, 40 ss. */
    .global hover_page_fault
hover_page_fault:
    cmpq $0, %gs:{off_preempt_count}
    jne 2f
    movq $2, %gs:{off_preempt_count}
    mov %rax, %gs:{off_irq_rax}
    mov %cr2, %rax
    mov %rax, %gs:{off_apf_park_token}
    mov 8(%rsp), %rax
    movq $hover_fault_entry, 8(%rsp)
    add $8, %rsp                    /* error code */
    iretq
2:  cmpl $0, %gs:{off_apf_flags}
    je 3f
    movl $0, %gs:{off_apf_flags}
    incq %gs:{off_apf_not_present}
    incq %gs:{off_apf_sync}
    add $8, %rsp                    /* error code */
    iretq
3:  pushq $14                       /* a real page fault */
    jmp exc_common

/* "Page ready": take the token and clear its slot, EOI, acknowledge (KVM
 * writes the next token only into a cleared slot, and delivers one queued
 * meanwhile only after the ACK). Preemptible code hands the token to the
 * runtime in apf_ready_one with the redirect. So does the case that is
 * common when pages come fast: the ready was pending while the nub
 * redirected the page's "not present", and KVM delivers it at the first
 * instruction of hover_fault_entry (rax = the task's RIP, its RAX in
 * irq_saved, preempt_count 2, apf_ready_one empty: the runtime empties
 * it before preemption is on again, preempt_irq included); the handler keeps RIP, RCX and RDX
 * there too and returns into hover_saved_entry. Otherwise the token goes
 * into the per-CPU ring, whose byte index wraps by itself (256 entries),
 * with nothing to save where the interrupted code keeps nothing in those
 * registers: nub_halt's hlt, and the first instruction of
 * hover_saved_entry (the next ready, delivered right after the last ACK,
 * comes there). */
.macro READY_TAKE
    movl %gs:{off_apf_token}, %eax
    movl $0, %gs:{off_apf_token}
.endm

.macro READY_TO_RING
    READY_TAKE
    movzbl %gs:{off_apf_ready_head}, %ecx
    mov %eax, %gs:{off_apf_ready_ring}(,%rcx,4)
    incb %gs:{off_apf_ready_head}
.endm

.macro EOI_ACK
    EOI
    mov ${msr_apf_ack}, %ecx
    inc %eax
    wrmsr
.endm

    .global hover_apf_ready
hover_apf_ready:
    IRQ_ENTER 1f
    READY_TAKE
    mov %eax, %gs:{off_apf_ready_one}
    EOI_ACK
    IRQ_REDIRECT
1:  cmpq $hover_fault_entry, (%rsp)
    jne 2f
    mov %rax, %gs:{off_irq_rip}
    mov %rcx, %gs:{off_irq_rcx}
    mov %rdx, %gs:{off_irq_rdx}
    READY_TAKE
    mov %eax, %gs:{off_apf_ready_one}
    EOI_ACK
    movq $hover_saved_entry, (%rsp)
    iretq
2:  cmpq $hover_saved_entry, (%rsp)
    je 3f
    IRQ_SLOW_ENTER 3f
    READY_TO_RING
    EOI_ACK
    IRQ_SLOW_EXIT
3:  READY_TO_RING
    EOI_ACK
    iretq

    .align 16
    .global hover_device_stubs
hover_device_stubs:                 /* 16 bytes per vector from DEVICE_BASE */
    .set vec, {device_base}
    .rept {device_count}
    .align 16
    pushq $vec
    jmp irq_device
    .set vec, vec + 1
    .endr

/* Spurious interrupts need no EOI. */
    .global hover_spurious
hover_spurious:
    iretq

/* Unexpected exceptions: record the frame in the per-CPU area (%gs) and
 * redirect the return to exception_entry at CPL3 on the exception stack,
 * where the runtime prints it and exits. A fault while doing so, or before
 * the per-CPU area exists, triple-faults: the monitor then dumps registers. */
exc_common:                         /* stack: vector, error, rip, cs, rflags, rsp, ss */
    cmpq $0, %gs:{off_self}
    je nub_triple_fault
    cmpq $0, %gs:{off_in_exception}
    jne nub_triple_fault
    movq $1, %gs:{off_in_exception}
    push %rax
    mov 8(%rsp), %rax
    mov %rax, %gs:{off_crash}
    mov 16(%rsp), %rax
    mov %rax, %gs:{off_crash}+8
    mov 24(%rsp), %rax
    mov %rax, %gs:{off_crash}+16
    mov 32(%rsp), %rax
    mov %rax, %gs:{off_crash}+24
    mov 48(%rsp), %rax
    mov %rax, %gs:{off_crash}+32
    mov %cr2, %rax
    mov %rax, %gs:{off_crash}+40
    lea {exception_entry}(%rip), %rax
    mov %rax, 24(%rsp)              /* rip */
    movq ${user_cs}, 32(%rsp)
    movq $0x202, 40(%rsp)
    mov %gs:{off_exception_stack}, %rax
    mov %rax, 48(%rsp)              /* rsp */
    movq ${user_ds}, 56(%rsp)
    pop %rax
    add $16, %rsp
    iretq

    .align 16
    .global hover_exception_stubs
hover_exception_stubs:
    .irp v, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
    .align 16
    .if (\v == 8) || (\v == 10) || (\v == 11) || (\v == 12) || (\v == 13) || (\v == 14) || (\v == 17) || (\v == 21) || (\v == 29) || (\v == 30)
    pushq $\v
    .else
    pushq $0
    pushq $\v
    .endif
    jmp exc_common
    .endr

    .section .rodata
    .align 8
nub_table:
    .quad nub_load_tables, nub_rdmsr, nub_wrmsr, nub_halt, nub_triple_fault, nub_set_deadline
    .align 16
idt_ptr:
    .word 256 * 16 - 1
    .quad {idt}
    .align 16
null_idt_ptr:
    .word 0
    .quad 0
