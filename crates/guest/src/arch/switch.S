/* Task switching, all at CPL3 (native). */
    .text

/* hover_context_switch(rdi = &prev.saved_rsp, rsi = next.saved_rsp):
 * a voluntary switch inside schedule(); only callee-saved registers need
 * saving (the SysV ABI makes every vector register caller-saved). */
    .global hover_context_switch
hover_context_switch:
    push %rbp
    push %rbx
    push %r12
    push %r13
    push %r14
    push %r15
    mov %rsp, (%rdi)
    mov %rsi, %rsp
    pop %r15
    pop %r14
    pop %r13
    pop %r12
    pop %rbx
    pop %rbp
    ret

/* First "return" of a new task: r12 = its index. */
    .global hover_task_trampoline
hover_task_trampoline:
    mov %r12, %rdi
    call {task_start}
    ud2

/* Where the nub sends preemptible code it interrupted: hover_irq_entry
 * after an interrupt (preempt_count 1), hover_fault_entry after a #PF
 * (preempt_count 2, CR2 in apf_park_token), hover_saved_entry after a
 * "page ready" that came at hover_fault_entry's first instruction (as after
 * a #PF, with the ready's token in apf_ready_one). RSP, RFLAGS and the
 * other registers are as the interrupted code left them. Its RIP is in RAX
 * and its RAX, RCX and RDX in PerCpu.irq_saved (only RAX for
 * hover_fault_entry); for hover_saved_entry all four are in irq_saved, so
 * the nub saves nothing for a ready that comes there again. Only the
 * redirect and that ready write irq_saved, before the entry runs. Step over the 128-byte red
 * zone (lea, mov, push and jmp leave the flags), push the RIP as a return
 * address, take back the saved registers, save everything the code may
 * have live (flags, all GPRs, x87 and SSE state), let the scheduler
 * switch, restore, and return past the red zone to the interrupted
 * instruction. */
    .global hover_saved_entry
hover_saved_entry:
    lea -128(%rsp), %rsp
    pushq %gs:{off_irq_rip}
    jmp 2f
    .global hover_irq_entry
hover_irq_entry:
    lea -128(%rsp), %rsp
    push %rax
2:  mov %gs:{off_irq_rcx}, %rcx
    mov %gs:{off_irq_rdx}, %rdx
    jmp 1f
    .global hover_fault_entry
hover_fault_entry:
    lea -128(%rsp), %rsp
    push %rax
1:  mov %gs:{off_irq_rax}, %rax
    pushfq
    cld
    push %rax
    push %rcx
    push %rdx
    push %rbx
    push %rbp
    push %rsi
    push %rdi
    push %r8
    push %r9
    push %r10
    push %r11
    push %r12
    push %r13
    push %r14
    push %r15
    mov %rsp, %rbx
    sub $512, %rsp
    and $-16, %rsp
    fxsave64 (%rsp)
    call {preempt_irq}
    fxrstor64 (%rsp)
    mov %rbx, %rsp
    pop %r15
    pop %r14
    pop %r13
    pop %r12
    pop %r11
    pop %r10
    pop %r9
    pop %r8
    pop %rdi
    pop %rsi
    pop %rbp
    pop %rbx
    pop %rdx
    pop %rcx
    pop %rax
    popfq
    ret $128
