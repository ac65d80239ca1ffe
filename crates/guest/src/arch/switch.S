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

/* Where the nub's interrupt tail sends a preempted task: RSP and every
 * register as the interrupted code left them, its RIP in PerCpu.resume_rip,
 * preempt_count = 1 (2 after a #PF; either way no other redirect
 * overwrites it). Step over its
 * 128-byte red zone (lea: the flags stay), push the RIP as a return
 * address, save everything it may have live (flags, all GPRs, x87 and SSE
 * state), let the scheduler switch, restore, and return past the red zone
 * to the interrupted instruction. */
    .global hover_preempt_entry
hover_preempt_entry:
    lea -128(%rsp), %rsp
    pushq %gs:{off_resume_rip}
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
